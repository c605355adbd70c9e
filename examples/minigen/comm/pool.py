"""The communication pool: IPC slabs shared with the other ranks."""

import ctypes
import glob
import os
from contextlib import contextmanager


def _load_cudart() -> ctypes.CDLL:
    """The CUDA runtime: the system's, else the one the PyTorch wheel ships
    (``MINIGEN_CUDART`` names another, e.g. a recording shim)."""
    names = [os.environ.get("MINIGEN_CUDART", "libcudart.so")]
    import torch

    names += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("no CUDA runtime library found")


libcudart = _load_cudart()

CHANNEL_BYTES = 12 * 1024 * 1024


class IpcChannel:
    """A device slab exported to the peers over CUDA IPC."""

    def __init__(self, nbytes: int = CHANNEL_BYTES):
        self.ptr = ctypes.c_void_p()
        libcudart.cudaMalloc(ctypes.byref(self.ptr), nbytes)
        self.handle = (ctypes.c_byte * 64)()
        libcudart.cudaIpcGetMemHandle(self.handle, self.ptr)

    def close(self) -> None:
        libcudart.cudaFree(self.ptr)


class CommPool:
    def __init__(self, world_size: int, rank: int):
        self.world_size = world_size
        self.rank = rank
        self._channels: list[IpcChannel] = []
        self._by_key: dict[str, IpcChannel] = {}
        self._checkpoint = 0

    def _new_channel(self, key: str) -> IpcChannel:
        channel = IpcChannel()
        self._channels.append(channel)
        self._by_key[key] = channel
        return channel

    @contextmanager
    def capture(self, key: str = "graph"):
        """Each capture gets a fresh channel, so graphs never share buffers."""
        previous = self._by_key.get("active")
        channel = self._new_channel(f"{key}-{len(self._channels)}")
        self._by_key["active"] = channel
        try:
            yield channel
        finally:
            self._by_key["active"] = previous

    @contextmanager
    def borrow(self, key: str):
        """A temporary channel, released on exit."""
        channel = IpcChannel()
        self._channels.append(channel)
        try:
            yield channel
        finally:
            self._channels.remove(channel)
            channel.close()

    def checkpoint(self) -> int:
        self._checkpoint = len(self._channels)
        return self._checkpoint

    def rollback(self, mark: int) -> None:
        while len(self._channels) > mark:
            self._channels.pop().close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@contextmanager
def graph_capture(pool: CommPool):
    """Capture context: enters the pool's per-capture channel."""
    with pool.capture():
        yield pool
