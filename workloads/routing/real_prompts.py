"""The prompts the routing lab sends real routers and simulated engines: a trace request's
blocks as text, one character per token (`prompt_text`). Block `h` is `chr(0x10000 + h)`
followed by `tokens - 1` copies of `chr(0x100000)`, so a block is the same text wherever it
appears and two different blocks differ at their first character, so a prefix match of SGLang's
character tree stops exactly at a block boundary (vLLM's tree holds the token ids as hex digits,
in which two blocks' first tokens can share a few). Every character is four bytes of UTF-8, so
byte and character counts keep the same ratios.
"""

from __future__ import annotations

from allocator import InvalidRequest

from .policies import BLOCK_TOKENS

FIRST_CHAR = 0x10000  # block h starts with chr(FIRST_CHAR + h): planes 1-15, four UTF-8 bytes
FILLER = chr(0x100000)  # the rest of every block (plane 16, four UTF-8 bytes too)
MAX_BLOCK_ID = 0x100000 - FIRST_CHAR - 1


def block_text(block: int, tokens: int) -> str:
    """Block `block`'s first `tokens` tokens as text (one character per token)."""
    if not 0 <= block <= MAX_BLOCK_ID:
        raise InvalidRequest(f"block id {block} is outside 0..{MAX_BLOCK_ID}, the ids this "
                             f"prompt encoding gives a character of their own")
    return chr(FIRST_CHAR + block) + FILLER * (tokens - 1)


def prompt_text(blocks: list[int], tokens: int) -> str:
    """The prompt of a trace request: its blocks' texts, the last one `tokens - 512 * (k - 1)`
    characters long (k blocks)."""
    last = len(blocks) - 1
    if not blocks or not BLOCK_TOKENS * last < tokens <= BLOCK_TOKENS * len(blocks):
        raise InvalidRequest(f"{tokens} tokens do not fill {len(blocks)} blocks of {BLOCK_TOKENS}")
    return "".join(block_text(b, BLOCK_TOKENS if k < last else tokens - BLOCK_TOKENS * last)
                   for k, b in enumerate(blocks))


def prompt_blocks(text: str) -> list[int]:
    """The block ids `prompt_text` encoded into `text` (the inverse, for checks)."""
    return [ord(c) - FIRST_CHAR for c in text if c != FILLER]
