"""kvscope's side of the engines' KV-event protocol (vLLM / SGLang over ZeroMQ).

- `codec`: the wire format (msgspec structs mirroring vLLM's, a lenient decoder for both the
  tagged-map form of vLLM >= 0.24 / SGLang and the positional-array form of vLLM <= 0.23).
- `publisher`: a PUB socket plus a ROUTER replay buffer, as vLLM's ZmqEventPublisher.
- `subscriber`: SUB + gap detection + DEALER replay + engine-restart detection, never dying.
- `recording`: a file of what a subscriber received, and its replay into a mirror.
- `fleet` + `index` (compiled `_index`): many engines' streams into one prefix index across them.
- `query`: what the routers' indexers answer (Dynamo's standalone indexer, llm-d's pod scores),
  from a fleet.

Depends on allocator/ (the mirror model) and on pyzmq + msgspec; allocator/ never imports it.
"""
