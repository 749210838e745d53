"""Request bodies of the JSON endpoints (OpenAI's field names plus vLLM's extras), validated by pydantic; an
unknown field, a wrong type or a non-finite number is a 400 naming it (errors.py)."""
from __future__ import annotations

from typing import Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TokenIds = List[StrictInt]
CompletionPrompt = Union[StrictStr, List[StrictStr], TokenIds, List[TokenIds]]


class _Strict(BaseModel):
    # Python's json module reads NaN, Infinity and 1e400 (inf) from a body; no float field takes them.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _SamplingFields(_Strict):
    """The sampling fields OpenAI and vLLM clients send; None means "not sent" (the model's default applies)."""

    model: StrictStr
    max_tokens: Optional[StrictInt] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: StrictInt = 1
    stop: Optional[Union[StrictStr, List[StrictStr]]] = None
    seed: Optional[StrictInt] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Dict[str, float]] = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[StrictStr] = None
    # vLLM's extra fields
    best_of: Optional[StrictInt] = None
    top_k: Optional[StrictInt] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[StrictInt] = None
    ignore_eos: Optional[StrictBool] = None
    stop_token_ids: Optional[TokenIds] = None
    skip_special_tokens: Optional[StrictBool] = None
    include_stop_str_in_output: Optional[StrictBool] = None
    no_repeat_ngram_size: Optional[StrictInt] = None
    bad_words: Optional[List[StrictStr]] = None
    allowed_token_ids: Optional[TokenIds] = None
    use_beam_search: StrictBool = False
    length_penalty: Optional[float] = None
    early_stopping: Optional[Union[StrictBool, Literal["never"]]] = None


class CompletionRequest(_SamplingFields):
    prompt: CompletionPrompt
    # An encoder/decoder model's decoder prompt (the prompt is then its encoder prompt).
    decoder_prompt: Optional[Union[StrictStr, TokenIds]] = None
    logprobs: Optional[StrictInt] = None
    echo: StrictBool = False
    suffix: Optional[StrictStr] = None


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[StrictStr, List[TextPart]]
    name: Optional[StrictStr] = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = None
    add_generation_prompt: StrictBool = True


class TokenizeRequest(_Strict):
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[List[ChatMessage]] = None
    add_special_tokens: StrictBool = True


class DetokenizeRequest(_Strict):
    model: Optional[StrictStr] = None
    tokens: TokenIds


class LoadLoRAAdapterRequest(_Strict):
    """POST /v1/load_lora_adapter (vLLM's body): serve the PEFT adapter at `lora_path` as `lora_name`, on the served
    model `base_model_name` (None: the first one)."""

    lora_name: StrictStr
    lora_path: StrictStr
    base_model_name: Optional[StrictStr] = None


class UnloadLoRAAdapterRequest(_Strict):
    """POST /v1/unload_lora_adapter (vLLM's body): the adapter by name, by id, or both."""

    lora_name: Optional[StrictStr] = None
    lora_int_id: Optional[StrictInt] = None
