"""The sampled tokens' way to the host: one copy a step into a pinned buffer, waited for apart."""
from __future__ import annotations

import torch


class TokensHome:
    """A step's sampled tokens to the host. On CUDA each head's tokens go into one pinned buffer
    without waiting (non_blocking, an event recorded after the copy), and wait() blocks until they
    are there: the host can do other work while the step runs. On the CPU they are there already."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.buf = torch.empty(size, dtype=torch.long, pin_memory=True) if self.cuda else None   # [size]
        self.event = torch.cuda.Event() if self.cuda else None
        self.used = 0

    def start(self) -> None:
        """A new step: the buffer is free again (the last step's tokens were read)."""
        self.used = 0

    def send(self, t: torch.Tensor) -> torch.Tensor:
        """t [b, K] integer tokens on the device -> their host tensor, to read after wait()."""
        if not self.cuda:
            return t
        n = t.numel()
        if self.used + n > self.buf.numel():           # more rows than the engine's batch: wait for these
            return t.cpu()
        host = self.buf[self.used:self.used + n].view(t.shape)
        self.used += n
        host.copy_(t, non_blocking=True)
        self.event.record()
        return host

    def wait(self) -> None:
        """Block until every tensor sent since start() is on the host."""
        if self.cuda:
            self.event.synchronize()
