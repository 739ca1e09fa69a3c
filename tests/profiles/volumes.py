"""A kubelet-style ConfigMap volume on local disk, for the hot-reload tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class ConfigMapVolume:
    """A directory laid out like a kubelet ConfigMap volume.

    ``..<timestamp>/profiles.json`` holds the data, ``..data`` points at the current
    timestamped directory, ``profiles.json`` points through ``..data``. An update writes a
    new timestamped directory, renames a temporary symlink over ``..data`` (atomic) and
    removes the old directory, as the kubelet's atomic writer does.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0

    @property
    def path(self) -> Path:
        return self.root / "profiles.json"

    def publish(self, content: str) -> None:
        self.version += 1
        data_dir = self.root / f"..2026_11_22_04_00_{self.version:02d}.{1000 + self.version}"
        data_dir.mkdir()
        (data_dir / "profiles.json").write_text(content)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        tmp = self.root / "..data_tmp"
        os.symlink(data_dir.name, tmp)
        os.rename(tmp, self.root / "..data")
        if not self.path.is_symlink():
            os.symlink("..data/profiles.json", self.path)
        if old:
            shutil.rmtree(self.root / old)

    def remove(self) -> None:
        for entry in self.root.iterdir():
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
            else:
                shutil.rmtree(entry)
