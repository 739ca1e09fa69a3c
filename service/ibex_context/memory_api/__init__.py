"""The memory API behind MemoryService: the write side (``writes``), the read side,
export and tenant purge (issue 16): the services the gRPC handlers call, each over
narrow store interfaces passed in explicitly."""
