"""Values of symbols in a shared object's own symbol table (``.symtab``), which the dynamic loader
does not export: what ``nm`` and gdb read, for a variable a library keeps private.

Used by the threadpools backend for OpenBLAS's ``blas_cpu_number`` (docs/internals.md, "threadpools").
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

__all__ = ["symbol_values"]

_SHT_SYMTAB = 2
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL_SIZE = 24  # Elf64_Sym: st_name (I), st_info, st_other (B, B), st_shndx (H), st_value, st_size (Q, Q)


def symbol_values(path: str, names: Iterable[str]) -> dict[str, int]:
    """``{name: st_value}`` for each of ``names`` defined in the ``.symtab`` of the 64-bit
    little-endian ELF file at ``path`` (offsets from the object's load address). A name that is
    absent, a stripped file (no ``.symtab``) or a file that is not such an ELF gives nothing."""
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            if header[:6] != b"\x7fELF\x02\x01":  # 64-bit, little-endian
                return {}
            section_offset, = struct.unpack_from("<Q", header, 0x28)
            entry_size, count = struct.unpack_from("<HH", header, 0x3A)
            file.seek(section_offset)
            table = file.read(entry_size * count)
            sections = [_SECTION_HEADER.unpack_from(table, i * entry_size) for i in range(count)]
            symtab = next((s for s in sections if s[1] == _SHT_SYMTAB), None)
            if symtab is None:
                return {}
            strtab = sections[symtab[6]]  # sh_link: the string table of its names
            file.seek(strtab[4])
            strings = file.read(strtab[5])
            file.seek(symtab[4])
            symbols = file.read(symtab[5])
    except (OSError, IndexError, struct.error):
        return {}
    values = {}
    for name in names:
        value = _value(symbols, strings, name.encode())
        if value is not None:
            values[name] = value
    return values


def _value(symbols: bytes, strings: bytes, name: bytes) -> int | None:
    # Find the name in the string table, then the symbol whose st_name points at it (a byte search
    # for that offset at symbol-aligned positions: a file has tens of thousands of symbols).
    start = strings.find(b"\0" + name + b"\0")
    if start < 0:
        return None
    needle = struct.pack("<I", start + 1)
    position = symbols.find(needle)
    while position >= 0:
        if position % _SYMBOL_SIZE == 0:
            value, = struct.unpack_from("<Q", symbols, position + 8)
            shndx, = struct.unpack_from("<H", symbols, position + 6)
            if shndx != 0:  # defined here, not an undefined reference
                return int(value)
        position = symbols.find(needle, position + 1)
    return None
