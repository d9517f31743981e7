"""One step of an `nn.LSTM` or `nn.GRU` in NumPy, as the rollout's NumPy copy of a recurrent
policy calls it (`common.numpy_copy`), made from the cell's weights as they are then; and what
every NumPy form of a module takes from it, its weights as float32 arrays (`float32_copy`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from common.errors import NoNumpyForm


def float32_copy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def numpy_cell(rnn: nn.Module) -> Callable[..., tuple[np.ndarray, Any]]:
    """One step of an `nn.LSTM` or `nn.GRU` in NumPy, called as torch calls it: (input (1, B, in),
    state) -> (output (1, B, hidden), state after the step), where a state is (hidden, cell) for an
    LSTM and hidden for a GRU, each (layers, B, hidden), or None for zeros."""
    if type(rnn) not in (nn.LSTM, nn.GRU) or _has_forward_hooks(rnn):
        raise NoNumpyForm(f"no NumPy form for the cell {rnn.__class__.__name__}")
    if (
        rnn.bidirectional
        or rnn.batch_first
        or getattr(rnn, "proj_size", 0)
        or (rnn.dropout and rnn.training)
    ):
        raise NoNumpyForm(
            "no NumPy form for a bidirectional, batch-first, projected or dropout cell"
        )
    layers = []
    for k in range(rnn.num_layers):
        weights = [
            float32_copy(getattr(rnn, f"weight_{kind}_l{k}")).T.copy() for kind in ("ih", "hh")
        ]
        biases = [
            float32_copy(getattr(rnn, f"bias_{kind}_l{k}")) if rnn.bias else np.float32(0)
            for kind in ("ih", "hh")
        ]
        layers.append((*weights, *biases))
    size, lstm = rnn.hidden_size, isinstance(rnn, nn.LSTM)

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return np.float32(1) / (np.float32(1) + np.exp(-x))

    def step(x: np.ndarray, state: Any = None) -> tuple[np.ndarray, Any]:
        if len(x) != 1:
            raise NoNumpyForm(f"the NumPy form of {type(rnn).__name__} takes one step at a time")
        x = x[0]
        if state is None:
            zeros = np.zeros((rnn.num_layers, len(x), size), np.float32)
            state = (zeros, zeros) if lstm else zeros
        hiddens, cells = state if lstm else (state, None)
        next_hiddens, next_cells = np.empty_like(hiddens), lstm and np.empty_like(cells)
        for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(layers):
            if lstm:
                # input, forget, cell, output: torch's order
                gates = x @ w_ih + b_ih + hiddens[k] @ w_hh + b_hh
                # one call for all four (the cell gate's is unused): fewer NumPy calls
                squashed = sigmoid(gates)
                cell = squashed[:, size : 2 * size] * cells[k] + squashed[:, :size] * np.tanh(
                    gates[:, 2 * size : 3 * size]
                )
                x = next_hiddens[k] = squashed[:, 3 * size :] * np.tanh(cell)
                next_cells[k] = cell
            else:
                # reset, update, new: torch's order
                from_input, from_hidden = (x @ w_ih + b_ih, hiddens[k] @ w_hh + b_hh)
                reset = sigmoid(from_input[:, :size] + from_hidden[:, :size])
                update = sigmoid(from_input[:, size : 2 * size] + from_hidden[:, size : 2 * size])
                new = np.tanh(from_input[:, 2 * size :] + reset * from_hidden[:, 2 * size :])
                x = next_hiddens[k] = (1 - update) * new + update * hiddens[k]
        return x[None], (next_hiddens, next_cells) if lstm else next_hiddens

    return step
