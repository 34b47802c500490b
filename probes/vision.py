"""The vision probe: a long request with a maximum-size image.

A 29K-token request with a maximum-size image can crash a server 144 MiB short of memory after hours of
text traffic went well: the vision encoder's temporaries live outside the KV pool, so a config
that leaves too little headroom survives text traffic and dies on the first big image. The probe sends
that request on the first boot: one maximum-size image (a real PNG, ``max_pixels`` pixels) beside a
needle-in-a-haystack text that brings the request to ``target_tokens``, and checks the needle comes back.
A boot runs it for a vision model only (``probes/plan.py``).
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from functools import lru_cache
from typing import Any

import httpx

from elsa_tune.probes import haystack
from elsa_tune.probes.client import ChatRequest, ProbeClient
from elsa_tune.probes.protocol import ProbeBudget, ProbeStatus
from elsa_tune.probes.stress import HealthCheck, Outcome, StressProbe, classify_replies, prompt_budget
from elsa_tune.runtime.gpu import GpuView
from elsa_tune.runtime.protocol import Server

#: Qwen-VL's default ``max_pixels`` (16384 tokens of 28 x 28 pixels): the largest image its processor keeps
MAX_IMAGE_PIXELS = 16384 * 28 * 28
#: the request length at which a maximum-size image is known to crash a tight config
DEFAULT_TARGET_TOKENS = 29_000
_QUESTION_WORDS = 60


@lru_cache(maxsize=4)
def png_data_url(width: int, height: int) -> str:
    """A valid grey PNG of ``width`` x ``height`` as a ``data:`` URL (compresses to a few KiB)."""
    row = b"\x00" + b"\x80" * width            # filter byte 0, then one grey byte per pixel
    raw = zlib.compress(row * height, 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", raw) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_part(pixels: int = MAX_IMAGE_PIXELS) -> dict[str, Any]:
    side = max(28, int(math.sqrt(pixels)) // 28 * 28)
    return {"type": "image_url", "image_url": {"url": png_data_url(side, side)}}


class VisionProbe(StressProbe):
    """One request with a maximum-size image and a needle in text, sized to ``target_tokens`` in all."""

    name = "vision"

    def __init__(self, check: HealthCheck, gpu: GpuView | None, *, target_tokens: int = DEFAULT_TARGET_TOKENS,
                 max_pixels: int = MAX_IMAGE_PIXELS, seed: int = 7) -> None:
        super().__init__(check, gpu)
        self.target_tokens = target_tokens
        self.max_pixels = max_pixels
        self.seed = seed

    async def _body(self, server: Server, budget: ProbeBudget) -> Outcome:
        client = ProbeClient(server.base_url, first_token_s=budget.request_timeout_s, hang_s=budget.hang_s)
        image = image_part(self.max_pixels)
        tokens = prompt_budget(server, self.target_tokens)
        async with httpx.AsyncClient(trust_env=False) as http:
            # the image alone first: how many tokens the server counts for it (and the first place it may die)
            small = haystack.build(_QUESTION_WORDS, depths=(0.5,), seed=self.seed)
            first = await client.chat(http, _ask_with_image(image, small, max_tokens=8))
            metrics: dict[str, object] = {"target_tokens": self.target_tokens, "image_pixels": self.max_pixels}
            bad = classify_replies([first], budget.hang_s)
            if bad is not None:
                return Outcome(bad.status, f"the maximum-size image alone: {bad.detail}", bad.failure, bad.evidence,
                               metrics)
            image_tokens = max(0, (first.prompt_tokens or 0) - _QUESTION_WORDS)
            metrics["image_tokens_estimate"] = image_tokens
            words = max(_QUESTION_WORDS, int((tokens - image_tokens - _QUESTION_WORDS) * 0.8))
            hay = haystack.build(words, depths=(0.5,), seed=self.seed + 1)
            reply = await client.chat(http, _ask_with_image(image, hay, max_tokens=32))
        metrics["prompt_tokens"] = reply.prompt_tokens
        bad = classify_replies([reply], budget.hang_s)
        if bad is not None:
            return Outcome(bad.status, f"a {reply.prompt_tokens or tokens:,}-token request with a maximum-size image: "
                           f"{bad.detail}", bad.failure, bad.evidence, metrics)
        needle = hay.needles[0]
        if not needle.found_in(reply.text):
            return Outcome(ProbeStatus.REGRESSED, "the needle beside the image was not retrieved",
                           evidence=(f"asked for {needle.name}: answered {reply.text[:80]!r}",), metrics=metrics)
        return Outcome(ProbeStatus.PASSED, f"a {reply.prompt_tokens or 0:,}-token request with a maximum-size image "
                       f"({image_tokens:,} image tokens) answered correctly", metrics=metrics)


def _ask_with_image(image: dict[str, Any], hay: haystack.Haystack, *, max_tokens: int) -> ChatRequest:
    content = [image, {"type": "text", "text": f"{hay.text}\n\n{hay.needles[0].question}"}]
    return ChatRequest(messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0.0)
