"""Conversations over the protocol the field's clients speak: `/v1/realtime`, JSON events after OpenAI's Realtime
API, PCM16 audio (docs/serving.md, "Conversations"). `audio.py` (PCM16, resampling, units), `events.py` (the
events), `conversation.py` (one conversation's protocol state), `messages.py` (its error codes and texts),
`app.py` (the Starlette app and its websocket), `page.html` (the page at `/`), `client.py` and `loadgen.py` (N
scripted conversations against a server)."""
