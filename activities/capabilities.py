"""Drop the one capability that would let a call's code undo its memory cap (Linux).

A supervised process sets its call's cap as both soft and hard RLIMIT_AS; raising a hard limit needs
CAP_SYS_RESOURCE, which a worker running as root has. Each supervised process drops it from its effective and
permitted sets (and its bounding set, so nothing it executes regains it) before serving, so code in a call cannot
raise the cap either; a later call that needs a larger cap gets a fresh process (env_child `MemoryCapRaised`).
glibc's `capget`/`capset` through ctypes: no library adds one capability call for us without a compiled dependency.
"""

from __future__ import annotations

import ctypes

CAP_SYS_RESOURCE = 24
_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set
_PR_CAPBSET_DROP = 24


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_sys_resource() -> bool:
    """Remove CAP_SYS_RESOURCE from this process for good; True when it no longer holds it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = _Header(_VERSION_3, 0), (_Data * 2)()
        if libc.capget(ctypes.byref(header), data) != 0:
            return False
        word, bit = divmod(CAP_SYS_RESOURCE, 32)
        mask = ~(1 << bit) & 0xFFFFFFFF
        libc.prctl(_PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0)  # needs CAP_SETPCAP; harmless where refused
        data[word].effective &= mask
        data[word].permitted &= mask
        data[word].inheritable &= mask
        if libc.capset(ctypes.byref(header), data) != 0:
            return False
        libc.capget(ctypes.byref(header), data)
        return not data[word].effective & (1 << bit)
    except (OSError, AttributeError):
        return False
