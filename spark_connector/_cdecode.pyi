def decode(
    raws: list[bytes], criterion: bytes | None, max_size: int, /
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes] | None:
    """Decode event encodings column-wise (see ``_cdecode.c``); ``None`` if any is unusual."""
