"""What the commands share: the Hydra entry over conf/, the task of ``python -m harness``,
and the sweep callback that prints and writes the comparison table."""
