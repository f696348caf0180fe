"""Read time: how long a read takes here, learned and measured, and the pacing of a read as it runs.

``estimator.ReadEstimator`` (one per session, ``DocumentSession.read_time``) answers the plan panel's and the queue's
estimates; ``costs`` keeps real reads' chunk timings and the load probe; ``read_rate`` measures the first read's cost in
the background; ``pace`` sizes a read's forwards and runs its ETA clock; ``flops`` is the FLOP model and the measured
FLOP rate the picker's estimates use."""
