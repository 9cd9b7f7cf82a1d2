def chunk_lines(text, max_chars):
    """Splits text into chunks of whole lines, each at most max_chars long (or one line)."""
    chunks, current, size = [], [], 0
    for line in text.splitlines():
        if current and size + len(line) + 1 > max_chars:
            chunks.append("\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        chunks.append("\n".join(current))
    return chunks
