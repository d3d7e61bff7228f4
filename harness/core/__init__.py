"""The shared base every layer above uses; it imports nothing else of the harness.

errors       the one-line refusal every command prints (ConfigError)
options      closed option sets and numeric ranges, declared beside each config key
comm         all communication: process groups, transfers and collectives with timeouts
host         worker processes on this host (forkserver, threads, allocator settings)
timing       one device timer for every measured span (CUDA events on a GPU)
models       timm ViTs as a list of partitionable layers
data         the data sets and the global batch order every strategy shares
training     the loss, batch shares, optimizer, schedule and precision every strategy trains with
checkpoints  where a run's checkpoints live
vocabulary   the names measurement and report share: idle and memory parts, the reference strategy
"""
