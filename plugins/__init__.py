"""Built-in plugins: stores, overlays, clocks and delivery orders.

Each module is registered through the ``ketten`` entry-point group in
ketten's own ``pyproject.toml``, exactly as a third-party plugin would be.
"""
