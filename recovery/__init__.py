"""capd's recovery layer: re-probes with cooldown, the durable retry queue, effect verification."""

__all__: list[str] = []
