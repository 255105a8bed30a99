"""The trainer past one process: DDP or FSDP2 ranks that tidal starts itself (`trainer.parallel`).

rank.py: one rank's share of a batch, the wrapped model and the collectives; launch.py: starting
ranks 1..N-1 on this machine; commands.py: what every rank runs per call; state.py: sharded
checkpoints that resume onto any world size; trainer.py: `ParallelTrainer`, rank 0 behind the
interface of one Trainer; worker.py: ranks 1..N-1.
"""
