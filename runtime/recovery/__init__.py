"""Recovery from failures: checkpoints that survive a crash mid-write, and how often to take them.

- ``store``: where checkpoint files live (a local directory or an S3-compatible bucket), with commits
  a reader sees whole or not at all (torch-free, boto3 only when S3 is used);
- ``checkpoint``: layered checkpoints (weights often, optimizer state less often) saved off the
  training thread, verified by checksum before a restart trusts them;
- ``advisor``: the checkpoint interval from the save cost and the failure rate (Young/Daly; torch-free);
- ``storehost``: the c10d rendezvous store in a process of its own, so rank 0's death does not take it down.

The package root imports nothing, so torch-free code (the control plane, backends) can use ``store``
and ``advisor`` without pulling in torch or boto3; import the submodules.
"""
