"""fp8kit.torch.memory: giving back to the system the memory an FP8 model no longer reads - the
pages of a weight mapped from a file once its FP8 form is made (a checkpoint's codes after packing,
a high-precision weight after quantize_), and the heap that quantizing layer by layer left free.

Checked by tests/python/test_fp8_checkpoints.py and test_torch.py (RSS of fresh processes against
the bytes the model holds; state_dict and outputs unchanged after the pages went).
"""
import bisect
import ctypes
import gc
import mmap
import sys

_LIBC = []


def _libc():
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _LIBC.append(libc)
    return _LIBC[0]


def file_mappings():
    """This process's file-backed mappings, as (sorted starts, [(start, end)]) from
    /proc/self/maps; empty where there is none to read (not Linux)."""
    spans = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                # a path (not [heap], [stack], anonymous or a deleted file's memfd) and a device
                if len(fields) == 6 and fields[5].startswith("/") and fields[3] != "00:00":
                    lo, hi = fields[0].split("-")
                    spans.append((int(lo, 16), int(hi, 16)))
    except OSError:
        pass
    spans.sort()
    return [s for s, _ in spans], spans


def in_file_mapping(t, mappings):
    """Whether tensor t's bytes lie inside one file mapping of `mappings` (file_mappings())."""
    starts, spans = mappings
    start = t.data_ptr()
    i = bisect.bisect_right(starts, start) - 1
    return t.is_cpu and i >= 0 and start + t.numel() * t.element_size() <= spans[i][1]


def release_pages(t):
    """Asks the kernel to reclaim the whole pages of tensor t's memory (Linux madvise MADV_PAGEOUT).
    Never loses data: clean pages of a file mapping (a safetensors file, never written) are dropped
    and read again from the file if anything reads them; anonymous or written pages would go to
    swap, so callers pass only file-mapped memory. Elsewhere, or on a kernel without MADV_PAGEOUT
    (Linux < 5.4), nothing happens."""
    if not sys.platform.startswith("linux") or not t.is_cpu:
        return
    page = mmap.PAGESIZE
    start = t.data_ptr()
    first, last = -(-start // page) * page, (start + t.numel() * t.element_size()) // page * page
    if last > first:  # only pages wholly inside t: its neighbours' bytes stay where they are
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 21)  # MADV_PAGEOUT


def trim_heap():
    """Hands the heap's free pages back (glibc's malloc_trim): quantizing layer by layer frees each
    high-precision weight between allocations of FP8 ones, and glibc keeps such freed memory in
    the process, where it counts as resident. Nothing elsewhere (another C library, not Linux)."""
    if sys.platform.startswith("linux"):
        trim = getattr(_libc(), "malloc_trim", None)
        if trim is not None:
            trim(0)


def give_back():
    """After a model's layers were replaced: the replaced modules that only a reference cycle keeps
    (Diffusers' and transformers' modules often sit in one) collected now, not at some later
    collection, and the heap they leave free handed back (trim_heap)."""
    gc.collect()
    trim_heap()
