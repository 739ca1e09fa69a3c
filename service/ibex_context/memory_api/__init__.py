"""The memory API's read side, export and tenant purge (issue 16): the services the
gRPC handlers call, each over narrow store interfaces passed in explicitly."""
