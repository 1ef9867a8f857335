"""The replica's context cache: which turn an entry may serve, and its bound in tokens."""

from rollart.activities.generate import ContextCache


def test_a_cached_context_serves_only_the_turn_after_its_request():
    cache = ContextCache(max_tokens=10)
    cache.put("t", "t.0.1", [1, 2, 3])
    assert cache.get("t", "t.0.1") == [1, 2, 3]
    assert cache.get("t", "t.0.2") is None  # the turn was served again elsewhere meanwhile
    assert cache.get("t", None) is None
    cache.put("u", "u.3.1", [4] * 6)
    cache.put("v", "v.0.1", [5] * 3)  # 12 tokens: the least recently used goes
    assert cache.get("t", "t.0.1") is None and len(cache) == 2 and cache.tokens == 9
    cache.drop("u")
    assert cache.tokens == 3
