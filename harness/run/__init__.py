"""Running one validated spec: start the workers, train on each rank, turn the outcome into a record.

launch    spawns the workers (or joins torchrun/Slurm's), ends them all when one fails, writes the record
worker    the per-rank training loop every strategy shares (data order, timing, memory, evaluation)
progress  the progress bar
"""
