"""What `import embedserve._native` finds where the native extension was not built.

The extension (`native/`, a Rust crate: docs/native.md) is `_native.abi3.so` beside this file,
which Python's import system prefers to a `.py` of the same name; this module is reached only
without it and says so.
"""

raise ImportError(
    "embedserve._native, the request path's native extension, is not built: install embedserve "
    "from source with Rust's cargo on PATH (pip install -e .; https://rustup.rs) or from a "
    "release wheel (docs/native.md)"
)
