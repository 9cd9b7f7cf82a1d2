"""Live contexts handed to a worker process through shared memory: the host writes each
object once into a memfd (`export_shared`), the worker maps it (`import_shared`).

Formats, by what the object is:
- `str`: UTF-8 (lone surrogates kept); the worker decodes it (one copy into its `str`).
- `bytes`-like: as is; the worker makes it a `str` when it is UTF-8.
- polars DataFrame, or any Arrow table (an object with `__arrow_c_stream__`, through polars):
  an uncompressed Arrow IPC file, which the worker's polars memory-maps (no copy).
- anything else (a pandas DataFrame, dicts and lists): a pickle, protocol 5, with its large
  buffers (numpy columns) out of band, 64-byte aligned, so the worker's arrays are views of
  the mapping (copy-on-write: writable, no copy until written).

Loaded under its own name (`_rlm_share`) without the kernel's interpreter patches: in the
Python package the host is the user's own interpreter.
"""

import mmap
import os
import pickle
import struct

_CHUNK = 1 << 24
_ALIGN = 64


def _is_polars_frame(value):
    cls = type(value)
    return cls.__name__ == "DataFrame" and (cls.__module__ or "").startswith("polars")


def _pad(f):
    extra = -f.tell() % _ALIGN
    if extra:
        f.write(b"\0" * extra)


def export_shared(value, fd):
    """Writes `value` into the memfd `fd` (at its start); returns the format's name."""
    with os.fdopen(os.dup(fd), "wb", buffering=1 << 20) as f:
        if isinstance(value, str):
            for start in range(0, len(value), _CHUNK):
                f.write(value[start : start + _CHUNK].encode("utf-8", "surrogatepass"))
            return "text"
        if isinstance(value, (bytes, bytearray, memoryview)):
            f.write(value)
            return "bytes"
        module = type(value).__module__ or ""
        frame = None
        if _is_polars_frame(value):
            frame = value
        elif hasattr(value, "__arrow_c_stream__") and not module.startswith("pandas"):
            import polars

            frame = polars.DataFrame(value)
        if frame is not None:
            try:
                frame.write_ipc(f, compression="uncompressed")
                return "arrow_ipc"
            except Exception:
                # Columns Arrow cannot hold (polars `Object`): pickled below instead.
                f.flush()
                f.seek(0)
                f.truncate()
        buffers = []
        try:
            data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        except Exception as e:
            raise TypeError(
                f"a {type(value).__module__}.{type(value).__qualname__} cannot be handed to the "
                f"worker process ({e}); pass plain data (str, dict, list, a data frame), or "
                'use isolation="none"'
            ) from None
        f.write(struct.pack("<Q", len(data)))
        f.write(data)
        f.write(struct.pack("<Q", len(buffers)))
        for buffer in buffers:
            raw = buffer.raw()
            f.write(struct.pack("<Q", raw.nbytes))
            _pad(f)
            f.write(raw)
        return "pickle"


def _mapping(fd, size):
    # Private and writable: copy-on-write, so the worker's values are ordinary mutable ones.
    return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def import_shared(fd, fmt):
    """The value `export_shared` wrote into the memfd `fd` in format `fmt`."""
    size = os.fstat(fd).st_size
    if fmt == "arrow_ipc":
        import polars

        try:
            # Memory-mapped by polars: the frame's buffers are the memfd's pages.
            return polars.read_ipc(f"/proc/self/fd/{fd}", memory_map=True)
        except Exception:
            return polars.read_ipc(_mapping(fd, size))
    view = memoryview(_mapping(fd, size)) if size else memoryview(b"")
    if fmt == "text":
        return str(view, "utf-8", "surrogatepass")
    if fmt == "bytes":
        data = bytes(view)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data
    if fmt == "pickle":
        (length,) = struct.unpack_from("<Q", view, 0)
        data = view[8 : 8 + length]
        at = 8 + length
        (count,) = struct.unpack_from("<Q", view, at)
        at += 8
        buffers = []
        for _ in range(count):
            (nbytes,) = struct.unpack_from("<Q", view, at)
            at += 8
            at += -at % _ALIGN
            buffers.append(view[at : at + nbytes])
            at += nbytes
        try:
            return pickle.loads(data, buffers=buffers)
        except (AttributeError, ImportError, ModuleNotFoundError) as e:
            raise TypeError(
                f"its class cannot be imported in the worker process ({e}); a class defined in "
                'a notebook or script cannot be rebuilt there: pass plain data, or use isolation="none"'
            ) from None
    raise ValueError(f"unknown shared format {fmt!r}")
