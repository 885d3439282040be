from evinfra.serve.replay import _finish_only


def test_a_closing_chunk_without_a_token_is_not_a_token() -> None:
    # Dynamo's frontend closes a stream with a chunk of its own
    assert _finish_only({"text": "", "finish_reason": "length"})
    assert _finish_only({"delta": {}, "finish_reason": "stop"})
    # the last token and the finish in one chunk, as evinfra sends it
    assert not _finish_only({"text": " end", "finish_reason": "length"})
    assert not _finish_only({"delta": {"content": "x"}, "finish_reason": "stop"})
    assert not _finish_only({"text": "", "finish_reason": None})
