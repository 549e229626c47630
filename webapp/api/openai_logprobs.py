"""Log-probabilities in OpenAI's two shapes, from the entries the served models send (deploy.client.Chunk:
``{"id", "token", "logprob", "top": [{"id", "token", "logprob"}]}``; a prompt's first token has logprob and top
None, nothing coming before it to score it).

A completion's (``choices[].logprobs``): four lists over the tokens, ``tokens``, ``token_logprobs``,
``top_logprobs`` (a dict of token → logprob per token, None where nothing scores it) and ``text_offset`` (where each
token's text starts in the choice's text). With ``echo`` the prompt's tokens come first, its first one scored None.
A chat's (``choices[].logprobs``): ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
"refusal": None}``.
"""


def completion_logprobs(entries: list[dict], start: int = 0) -> dict:
    """OpenAI's completion logprobs of ``entries``, their text starting at character ``start`` of the choice's
    text (0; or, for the answer's tokens streamed after others, where the text so far ends)."""
    tokens, offsets = [], []
    for entry in entries:
        offsets.append(start)
        tokens.append(entry["token"])
        start += len(entry["token"])
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top"]} if e["top"] is not None else None
                             for e in entries],
            "text_offset": offsets}


def _chat_token(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(entries: list[dict]) -> dict:
    """OpenAI's chat logprobs of the answer's ``entries``."""
    return {"content": [{**_chat_token(e["token"], e["logprob"]),
                         "top_logprobs": [_chat_token(t["token"], t["logprob"]) for t in e["top"]]}
                        for e in entries],
            "refusal": None}
