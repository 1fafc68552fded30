"""Chat templates the tests build tiny tokenizers with (the real ones, cut to what a test needs)."""

from __future__ import annotations

#: GLM-4.5's template, reduced: its tool turns open with `<|observation|>`, a special token that
#: is also GLM's stop string (the model writes it after its last call).
GLM_TEMPLATE = (
    "[gMASK]<sop>{%- for m in messages %}"
    "{%- if m.role == 'system' %}<|system|>\n{{ m.content }}"
    "{%- elif m.role == 'user' %}<|user|>\n{{ m.content }}"
    "{%- elif m.role == 'assistant' %}<|assistant|>\n{{ m.content }}"
    "{%- elif m.role == 'tool' %}{%- if loop.index0 == 0 or messages[loop.index0-1].role != 'tool' %}"
    "<|observation|>{%- endif %}\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|assistant|>\n{%- endif %}"
)
