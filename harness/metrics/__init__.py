"""What a run measures, measured one way for every strategy.

meter     per-rank step measurements: live training memory, idle time and compute spans, RSS
flops     training FLOPs per step and the device peak they are judged against (MFU, HFU)
measured  what the run layer hands derive: a rank's measurements, the run's account, the strategy's facts
derive    the record's figures, from those
"""
