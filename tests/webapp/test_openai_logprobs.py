"""The models' log-probability entries in OpenAI's completion and chat shapes (webapp.api.openai_logprobs)."""
from webapp.api.openai_logprobs import chat_logprobs, completion_logprobs

PROMPT = [{"id": 5, "token": "RO", "logprob": None, "top": None},
          {"id": 6, "token": "MEO", "logprob": -1.5, "top": [{"id": 6, "token": "MEO", "logprob": -1.5},
                                                             {"id": 9, "token": "SE", "logprob": -2.0}]}]
ANSWER = [{"id": 7, "token": ":", "logprob": -0.25, "top": [{"id": 7, "token": ":", "logprob": -0.25}]},
          {"id": 8, "token": " é", "logprob": -3.0, "top": []}]


def test_a_completions_logprobs_list_each_token_where_its_text_starts_the_prompts_first_unscored():
    shaped = completion_logprobs(PROMPT + ANSWER)
    assert shaped == {"tokens": ["RO", "MEO", ":", " é"], "token_logprobs": [None, -1.5, -0.25, -3.0],
                      "top_logprobs": [None, {"MEO": -1.5, "SE": -2.0}, {":": -0.25}, {}],
                      "text_offset": [0, 2, 5, 6]}
    assert completion_logprobs(ANSWER, start=5)["text_offset"] == [5, 6]  # streamed after 5 characters


def test_a_chats_logprobs_give_each_tokens_bytes_and_alternatives():
    shaped = chat_logprobs(ANSWER)
    assert shaped["refusal"] is None
    assert shaped["content"][1] == {"token": " é", "logprob": -3.0, "bytes": [32, 195, 169], "top_logprobs": []}
    assert shaped["content"][0]["top_logprobs"] == [{"token": ":", "logprob": -0.25, "bytes": [58]}]
