"""The wire format: the versioned envelope of every stream entry, the batched on_chunk hop's
data, and the W3C trace context an envelope carries."""
