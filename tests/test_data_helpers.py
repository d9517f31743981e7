"""The digideep data helpers: every example of the seed document, plus property tests."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.data_helpers import (
    complete_dict_of_list,
    convert_time_to_batch_major,
    describe,
    dict_of_lists_to_list_of_dicts,
    extract_keywise,
    flatten_dict,
    join_keys,
    list_of_dicts_to_flattened_dict_of_lists,
    nonify,
    unflatten_dict,
    update_dict_of_lists,
)

# --- the seed's examples -------------------------------------------------------------------------------------------


def test_complete_dict_of_list_seed_example():
    dic = {
        "a": [1, 2, 3, 4],
        "b": [[None, None, None], [None, None, None], [None, None, None], [1, 2, 3]],
        "c": [[-1, -2], [-3, -4]],
    }
    assert complete_dict_of_list(dic, 4) == {
        "a": [1, 2, 3, 4],
        "b": [[None, None, None], [None, None, None], [None, None, None], [1, 2, 3]],
        "c": [[-1, -2], [-3, -4], [None, None], [None, None]],
    }


def test_convert_time_to_batch_major_seed_example():
    episode = {
        "key1": [[[1], [2]], [[3], [4]], [[5], [6]], [[7], [8]], [[9], [10]]],
        "key2": [
            [[1, 2], [3, 4]],
            [[5, 6], [7, 8]],
            [[9, 10], [11, 12]],
            [[13, 14], [15, 16]],
            [[17, 18], [19, 20]],
        ],
    }
    result = convert_time_to_batch_major(episode)
    np.testing.assert_array_equal(
        result["key1"], [[[1], [3], [5], [7], [9]], [[2], [4], [6], [8], [10]]]
    )
    np.testing.assert_array_equal(
        result["key2"],
        [
            [[1, 2], [5, 6], [9, 10], [13, 14], [17, 18]],
            [[3, 4], [7, 8], [11, 12], [15, 16], [19, 20]],
        ],
    )
    assert result["key1"].shape == (2, 5, 1) and result["key2"].shape == (2, 5, 2)


def test_dict_of_lists_to_list_of_dicts_seed_example():
    dic = {"a1": ([1, 2], [3, 4], [5, 6]), "a2": ([9], [8], [7])}
    assert dict_of_lists_to_list_of_dicts(dic, 3) == [
        {"a1": [1, 2], "a2": [9]},
        {"a1": [3, 4], "a2": [8]},
        {"a1": [5, 6], "a2": [7]},
    ]


def test_extract_keywise_seed_example():
    dic = {
        "agent1": {"a": [1, 2], "b": {"c": 2, "d": 4}},
        "agent2": {"a": [3, 4], "b": {"c": 9, "d": 7}},
    }
    assert extract_keywise(dic, "a") == {"agent1": [1, 2], "agent2": [3, 4]}
    assert extract_keywise(dic, "b") == {"agent1": {"c": 2, "d": 4}, "agent2": {"c": 9, "d": 7}}


def test_flatten_and_unflatten_seed_examples():
    nested = {"a": 1, "b": {"c": 1, "d": {"e": 2, "f": 3}}}
    flat = {"/a": 1, "/b/c": 1, "/b/d/e": 2, "/b/d/f": 3}
    assert flatten_dict(nested) == flat
    assert unflatten_dict(flat) == nested


def test_join_keys_seed_example():
    assert join_keys("/agent1", "artifcats") == "/agent1/artifcats"
    assert join_keys("/agent1/", "/artifacts") == "/agent1/artifacts"
    assert join_keys("a", "b", sep=".") == "a.b"


def test_list_of_dicts_to_flattened_dict_of_lists_seed_example():
    samples = [
        {"a": {"f": [1, 2], "g": [7, 8]}, "b": [-1, -2], "info": [10, 20]},
        {"a": {"f": [3, 4], "g": [9, 8]}, "b": [-3, -4], "step": [80, 90]},
    ]
    assert list_of_dicts_to_flattened_dict_of_lists(samples, 2) == {
        "/a/f": [[1, 2], [3, 4]],
        "/a/g": [[7, 8], [9, 8]],
        "/b": [[-1, -2], [-3, -4]],
        "/info": [[10, 20], [None, None]],
        "/step": [[None, None], [80, 90]],
    }


def test_nonify_seed_example():
    assert nonify([(1, 2, 3), (1, 2, 4, 5, [-1, -2])]) == [
        (None, None, None),
        (None, None, None, None, [None, None]),
    ]


def test_update_dict_of_lists_seed_example():
    dic = {"a": [1, 2, 3], "c": [[-1, -2], [-3, -4]]}
    result = update_dict_of_lists(dic, {"a": 4, "b": [1, 2, 3]}, index=3)
    assert result is dic
    assert dic == {
        "a": [1, 2, 3, 4],
        "b": [[None, None, None], [None, None, None], [None, None, None], [1, 2, 3]],
        "c": [[-1, -2], [-3, -4]],  # not complete yet: complete_dict_of_list does that
    }


# --- the choices made where the seed contradicts itself ------------------------------------------------------------


def test_nonify_fills_arrays_with_nan_of_the_same_shape():
    filled = nonify(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert filled.shape == (2, 3) and filled.dtype == np.float64 and np.isnan(filled).all()
    assert nonify(np.zeros(3, dtype=np.float32)).dtype == np.float32
    assert nonify(5) is None
    with pytest.raises(TypeError):
        nonify({"a": 1})


def test_convert_time_to_batch_major_keeps_dtypes_and_turns_missing_into_nan():
    result = convert_time_to_batch_major(
        {
            "actions": [np.array([1, 2], dtype=np.int64), np.array([3, 4], dtype=np.int64)],
            "flags": [np.array([True, False]), np.array([False, True])],
            "value": [[0.5, 1.5], [None, None]],
            "obs": [np.ones((2, 3)), nonify(np.ones((2, 3)))],
        }
    )
    assert result["actions"].dtype == np.int64
    np.testing.assert_array_equal(result["actions"], [[1, 3], [2, 4]])
    assert result["flags"].dtype == bool
    assert result["value"].dtype == np.float64
    np.testing.assert_array_equal(result["value"], [[0.5, np.nan], [1.5, np.nan]])
    assert np.isnan(result["obs"][:, 1]).all() and (result["obs"][:, 0] == 1).all()


def test_filled_entries_are_independent_objects():
    dic = complete_dict_of_list({"a": [[1, 2]]}, 3)
    dic["a"][1][0] = "changed"
    assert dic["a"][2] == [None, None]
    arrays = complete_dict_of_list({"x": [np.zeros(2)]}, 3)["x"]
    arrays[1][0] = 7.0
    assert np.isnan(arrays[2]).all()
    grown = update_dict_of_lists({}, {"b": [1]}, index=2)
    grown["b"][0][0] = "changed"
    assert grown["b"][1] == [None]


def test_errors_name_the_key():
    with pytest.raises(ValueError, match="'x'"):
        complete_dict_of_list({"x": [1, 2, 3]}, 2)
    with pytest.raises(ValueError, match="'a1'"):
        dict_of_lists_to_list_of_dicts({"a1": [1, 2]}, 3)
    with pytest.raises(ValueError, match="'ragged'"):
        convert_time_to_batch_major({"ragged": [[1, 2], [3]]})
    with pytest.raises(KeyError, match="agent2"):
        extract_keywise({"agent1": {"a": 1}, "agent2": {"b": 2}}, "a")
    with pytest.raises(ValueError, match="separator"):
        flatten_dict({"a/b": 1})
    with pytest.raises(ValueError, match="collides"):
        unflatten_dict({"/a/b": 1, "/a": 2})


def test_describe_reports_shapes_dtypes_nans_and_statistics():
    table = describe(
        {"obs": np.array([[1.0, np.nan], [3.0, np.inf]]), "agent": {"act": np.array([0, 1, 1, 0])}}
    )
    lines = table.splitlines()
    assert lines[0].split() == ["key", "shape", "dtype", "nan", "inf", "mean", "std"]
    assert lines[1].split() == ["/obs", "(2,", "2)", "float64", "1", "1", "2", "1"]
    assert lines[2].split() == ["/agent/act", "(4,)", "int64", "0", "0", "0.5", "0.5"]
    flat = describe({"/already/flat": np.array(["x", "y"])}).splitlines()[1].split()
    assert flat == ["/already/flat", "(2,)", "<U1", "-", "-", "-", "-"]


# --- properties ----------------------------------------------------------------------------------------------------

keys = st.text(
    alphabet=st.characters(blacklist_characters="/", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=5,
)
leaves = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=3),
)
nested_dicts = st.recursive(
    st.dictionaries(keys, leaves, max_size=4),
    lambda children: st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)


@given(nested_dicts)
def test_flatten_then_unflatten_is_the_identity(dic):
    flat = flatten_dict(dic)
    assert all(key.startswith("/") for key in flat)
    assert not any(isinstance(value, dict) and value for value in flat.values())
    assert unflatten_dict(flat) == dic


@given(nested_dicts)
def test_unflatten_then_flatten_is_the_identity(dic):
    flat = flatten_dict(dic)
    assert flatten_dict(unflatten_dict(flat)) == flat


@given(
    st.lists(st.dictionaries(st.sampled_from("abcde"), st.integers(), max_size=5), max_size=6),
    st.integers(0, 3),
)
def test_list_of_dicts_with_missing_keys(samples, extra):
    length = len(samples) + extra
    result = list_of_dicts_to_flattened_dict_of_lists(samples, length)
    assert set(result) == {"/" + key for sample in samples for key in sample}
    for key, values in result.items():
        assert len(values) == length
        for index in range(length):
            expected = samples[index].get(key[1:]) if index < len(samples) else None
            assert values[index] == expected


@given(
    st.dictionaries(
        st.sampled_from("abc"), st.lists(st.integers(), min_size=4, max_size=4), min_size=1
    )
)
def test_dict_of_lists_and_list_of_dicts_are_inverse(dic):
    per_worker = dict_of_lists_to_list_of_dicts(dic, 4)
    assert len(per_worker) == 4
    back = list_of_dicts_to_flattened_dict_of_lists(per_worker, 4)
    assert back == {"/" + key: values for key, values in dic.items()}


@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2))
def test_time_to_batch_major_swaps_the_first_two_axes(num_steps, batch_size, trailing):
    rng = np.random.default_rng(num_steps * 100 + batch_size * 10 + trailing)
    time_major = rng.normal(size=(num_steps, batch_size, *([2] * trailing)))
    batch_major = convert_time_to_batch_major({"x": list(time_major)})["x"]
    assert batch_major.shape == (batch_size, num_steps, *([2] * trailing))
    for t in range(num_steps):
        for b in range(batch_size):
            np.testing.assert_array_equal(batch_major[b, t], time_major[t, b])
