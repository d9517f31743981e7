#!/bin/bash
# The batch script of onefile-rl's SLURM job arrays (`python -m benchmark run|tune ... --launcher slurm`,
# docs/cluster.md). Copy it, add your cluster's lines, and give the copy with --slurm-template.
#
# The harness gives sbatch the array, --requeue, --signal, --output and --chdir (the checkout), and the flags you
# set (--slurm-partition, --slurm-time, --slurm-cpus-per-task, --slurm-gpus-per-task): they override the lines here.
# Everything else your cluster wants goes here, e.g.:
##SBATCH --account=ACCOUNT
##SBATCH --qos=QOS
##SBATCH --mem-per-cpu=4G
#SBATCH --job-name=onefile-rl
#
# module load python/3.11
# source /path/to/onefile-rl/.venv/bin/activate
#
# {{command}} runs one element: its run, which checkpoints on SLURM's signal and requeues itself. Keep the `exec`:
# SLURM signals the batch shell before the time limit, and exec makes the element that shell.
exec {{command}}
