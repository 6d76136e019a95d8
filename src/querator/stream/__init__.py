"""Streaming consumers: leased items pushed over a WebSocket (docs/api.md, "Streaming").

``protocol`` (the messages) and ``session`` (one connection's credit and held items) are pure and
shared; ``local`` is the WebSocket of ``querator serve``.
"""
