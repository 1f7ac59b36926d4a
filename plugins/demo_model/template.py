"""The demo model's chat template: Qwen2.5's ChatML with tools, plus Qwen3-style `<think>` blocks.

Every piece of text is emitted by an expression and every tag strips whitespace on its left, so
the layout below is for reading only (transformers renders with trim_blocks).

- `tools`: a system block listing each tool as JSON inside `<tools></tools>`.
- assistant `tool_calls`: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` each.
- `tool` messages: `<tool_response>` blocks, consecutive ones inside one user turn.
- assistant `reasoning_content` (or `reasoning`) after the last user turn: `<think>...</think>`.
- `enable_thinking=False`: the generation prompt opens and closes an empty think block.
"""

CHAT_TEMPLATE = r"""
{%- macro render(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}{{- content -}}
    {%- elif content is mapping -%}{{- content | tojson -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}{{- part -}}
            {%- elif part.type == 'text' -%}{{- part.text -}}
            {%- else -%}{{- raise_exception('unsupported content part type: ' ~ part.type) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if messages[0].role == 'system' -%}
    {%- set system = render(messages[0].content) -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system = none -%}
    {%- set rest = messages -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system is not none -%}{{- system + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system is not none -%}
    {{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in rest -%}
    {%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in rest -%}
    {%- if message.role == 'user' -%}
        {{- '<|im_start|>user\n' + render(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'system' -%}
        {{- '<|im_start|>system\n' + render(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- set reasoning = message.reasoning_content or message.reasoning -%}
        {%- if reasoning and loop.index0 > ns.last_user -%}
            {{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- render(message.content) -}}
        {%- for tc in message.tool_calls or [] -%}
            {%- set f = tc.function if tc.function is defined else tc -%}
            {%- if loop.first and message.content -%}{{- '\n' -}}{%- elif not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
            {%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- (f.arguments or {}) | tojson -}}{%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or rest[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + render(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or rest[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown message role: ' ~ message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
