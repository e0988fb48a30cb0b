"""Communication that does not hold training back (issue 6).

- ``codecs``: top-k with error feedback and compact index encodings, PowerSGD, fp16's scale;
- ``transport``: counted point-to-point messages, per link class, and the token-bucket link throttle;
- ``collectives``: all-reduce in any wire dtype (ring, or direct when small), all-gather of byte
  buffers, intra-group reduce/broadcast;
- ``reducer``: the worker's bucketed, overlapped, hierarchical gradient exchange under a policy;
- ``auto``: the policy chosen from the measured link bandwidth and the model size;
- ``session``: what a rank calls once its process group exists;
- ``link``: how the local backend emulates a slow cross-group link (torch-free).

The package root imports nothing, so torch-free code (worker configs, backends) can use ``link``;
import the submodules.
"""
