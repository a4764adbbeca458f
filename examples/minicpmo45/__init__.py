"""MiniCPM-o 4.5's token-to-audio tail (Step-Audio2 Token2wav from ``stepaudio2-minicpmo`` 0.1.1).

``package`` imports the package's model modules without its front end, ``model`` builds the
released sizes with seeded random weights, ``stock`` drives the stock ``Token2wav.stream`` the way
MiniCPM-o does, ``patches`` holds value-identical changes (device-cached constants, demand-sized
buffers). ``live`` runs MiniCPM-o 4.5's duplex unit loop (``live_model``: the LLM, audio encoder and
TTS on ``transformers`` at the sizes of ``live_config``) with the tail stock and under DuplexCadence
side by side. See README.md in this folder.
"""
