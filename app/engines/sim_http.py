"""One simulated engine's HTTP API (`build_app`): what sglang-router, vllm-router and Dynamo's
frontend probe and send. `GET /health`, `/health_generate`, `/v1/models`, `/get_server_info`
(with `block_size` and `page_size`), `/get_model_info`, `/metrics` (vLLM's names:
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`, `vllm:cache_config_info`,
...), `POST /v1/completions`, `/v1/chat/completions` (both with `stream`), `/generate`
(SGLang's), `/tokenize`, `/detokenize` and `/v1/completions/render` (prompt to token ids, as
vLLM's render endpoint). An answer comes when the engine (`sim_engine.SimEngine`) says the
request is done; a streamed one's first chunk when its prefill ends. A bad body is a 400 in the
engines' error shape and queues nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from allocator import InvalidRequest

from .sim_engine import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, Pending, SimEngine, detokenize, output_text, tokenize

MAX_BODY = 64 << 20


class BadRequest(Exception):
    pass


def _prompt_tokens(engine: SimEngine, body: dict, *keys: str) -> list[int]:
    for key in keys:
        if key in body and body[key] is not None:
            v = body[key]
            if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
                v = v[0]  # a batch of one prompt
            if isinstance(v, str):
                if len(v) > MAX_PROMPT_TOKENS * 16:
                    raise BadRequest(f"{key} is longer than {MAX_PROMPT_TOKENS * 16:,} characters")
                ids = tokenize(v, engine.cfg.tokenizer)
            elif isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) and
                                             0 <= t < 1 << 31 for t in v):
                ids = list(v)
            else:
                raise BadRequest(f"{key} must be a string or a list of token ids (0 <= id < 2^31)")
            if len(ids) > MAX_PROMPT_TOKENS:
                raise BadRequest(f"{key} has {len(ids):,} tokens; at most {MAX_PROMPT_TOKENS:,}")
            return ids
    raise BadRequest(f"the body needs {' or '.join(repr(k) for k in keys)}")


def _chat_text(body: dict) -> str:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list of {role, content}")
    parts = []
    for m in msgs:
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object with role and content")
        c = m.get("content")
        if isinstance(c, list):  # OpenAI content parts
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        if not isinstance(c, str):
            raise BadRequest("a message's content must be a string or a list of text parts")
        parts.append(c)
    return " ".join(parts)


def _max_tokens(body: dict, *keys: str, default: int = 16) -> int:
    for key in keys:
        v = body.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_OUTPUT_TOKENS:
                raise BadRequest(f"{key} must be a whole number 1..{MAX_OUTPUT_TOKENS}, got {v!r}")
            return v
    return default


def build_app(engine: SimEngine):
    """The engine's HTTP API (a Starlette app; FastAPI's validation is not wanted here: these
    endpoints answer what engines answer, including their error shape)."""
    loop_of = asyncio.get_running_loop
    ids = itertools.count(1)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                             "code": status}, status_code=status)

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise BadRequest(f"the body is larger than {MAX_BODY >> 20} MiB")
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def submit(tokens, max_tokens, body: dict) -> Pending:
        tag = body.get("user")
        try:
            return engine.submit(tokens, max_tokens, loop_of(),
                                 tag=tag if isinstance(tag, str) and len(tag) <= 256 else None)
        except InvalidRequest as exc:
            raise BadRequest(str(exc)) from None

    def usage(p: Pending, cached: int) -> dict:
        return {"prompt_tokens": p.prompt_tokens, "completion_tokens": p.output_tokens,
                "total_tokens": p.prompt_tokens + p.output_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def ok(_: Request):
        return Response(status_code=200)

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [{
            "id": engine.cfg.model, "object": "model", "created": 0, "owned_by": "kvscope",
            "max_model_len": engine.cfg.max_len()}]})

    async def server_info(_: Request):
        return JSONResponse(engine.server_info())

    async def model_info(_: Request):
        return JSONResponse({"model_path": engine.cfg.model, "tokenizer_path": engine.cfg.model,
                             "is_generation": True, "served_model_name": engine.cfg.model})

    async def metrics(_: Request):
        return Response(engine.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    async def stats(_: Request):
        return JSONResponse(engine.stats())

    async def tokenize_route(request: Request):
        body = await body_of(request)
        if "messages" in body:
            tokens = tokenize(_chat_text(body), engine.cfg.tokenizer)
        else:
            tokens = _prompt_tokens(engine, body, "prompt", "text")
        return JSONResponse({"tokens": tokens, "count": len(tokens),
                             "max_model_len": engine.cfg.max_len()})

    async def detokenize_route(request: Request):
        body = await body_of(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise BadRequest("tokens must be a list of token ids")
        return JSONResponse({"prompt": detokenize(tokens)})

    async def render(request: Request):
        """vLLM's render endpoints: a `GenerateRequest` (request_id, token_ids, sampling_params,
        model) for a chat, a list of them (one per prompt) for a completion."""
        body = await body_of(request)
        chat = request.url.path.startswith("/v1/chat/")
        if chat:
            tokens = tokenize(_chat_text(body), engine.cfg.tokenizer)
        else:
            tokens = _prompt_tokens(engine, body, "prompt")
        out = {"request_id": f"render-{engine.cfg.name}-{next(ids)}", "token_ids": tokens,
               "token_offsets": None, "sampling_params": {
                   "max_tokens": _max_tokens(body, "max_completion_tokens", "max_tokens")},
               "model": body.get("model") or engine.cfg.model}
        return JSONResponse(out if chat else [out])

    async def respond(kind: str, p: Pending, stream: bool, name: str):
        """An OpenAI answer: the whole completion when the engine is done, or (stream) a first
        chunk when its prefill ends and the rest when it is done."""
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{engine.cfg.name}-{next(ids)}"
        created = int(time.time())
        obj = "chat.completion" if kind == "chat" else "text_completion"

        def choice(text: str, finish: str | None, delta: bool) -> dict:
            if kind == "chat":
                key = "delta" if delta else "message"
                return {"index": 0, key: {"role": "assistant", "content": text},
                        "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

        if not stream:
            cached = await p.done
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": name,
                                 "choices": [choice(output_text(p.output_tokens), "length", False)],
                                 "usage": usage(p, cached)})

        async def chunks():
            await p.first
            chunk = obj + ".chunk" if kind == "chat" else obj
            first = {"id": rid, "object": chunk, "created": created, "model": name,
                     "choices": [choice("tok", None, True)]}
            yield f"data: {json.dumps(first)}\n\n".encode()
            cached = await p.done
            rest = output_text(p.output_tokens - 1)
            last = {"id": rid, "object": chunk, "created": created, "model": name,
                    "choices": [choice((" " + rest) if rest else "", "length", True)],
                    "usage": usage(p, cached)}
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def completions(request: Request):
        body = await body_of(request)
        tokens = _prompt_tokens(engine, body, "prompt")
        p = submit(tokens, _max_tokens(body, "max_tokens"), body)
        return await respond("completion", p, bool(body.get("stream")),
                             body.get("model") or engine.cfg.model)

    async def chat(request: Request):
        body = await body_of(request)
        tokens = tokenize(_chat_text(body), engine.cfg.tokenizer)
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise BadRequest(f"the messages have {len(tokens):,} tokens; at most {MAX_PROMPT_TOKENS:,}")
        p = submit(tokens, _max_tokens(body, "max_completion_tokens", "max_tokens"), body)
        return await respond("chat", p, bool(body.get("stream")),
                             body.get("model") or engine.cfg.model)

    async def generate(request: Request):  # SGLang's native API
        body = await body_of(request)
        tokens = _prompt_tokens(engine, body, "input_ids", "text")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        p = submit(tokens, _max_tokens(params, "max_new_tokens"), body)
        cached = await p.done
        return JSONResponse({"text": output_text(p.output_tokens), "meta_info": {
            "id": f"{engine.cfg.name}-{p.rid}", "prompt_tokens": p.prompt_tokens,
            "completion_tokens": p.output_tokens, "cached_tokens": cached,
            "finish_reason": {"type": "length", "length": p.output_tokens}}})

    async def bad_request(_: Request, exc: BadRequest):
        return error(400, str(exc))

    routes = [
        Route("/health", ok), Route("/health_generate", ok), Route("/ping", ok),
        Route("/v1/models", models), Route("/get_server_info", server_info),
        Route("/server_info", server_info), Route("/get_model_info", model_info),
        Route("/model_info", model_info),
        Route("/metrics", metrics), Route("/stats", stats),
        Route("/tokenize", tokenize_route, methods=["POST"]),
        Route("/detokenize", detokenize_route, methods=["POST"]),
        Route("/v1/completions/render", render, methods=["POST"]),
        Route("/v1/chat/completions/render", render, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={BadRequest: bad_request})
