"""A serverless reward for the arithmetic domain: checks the policy's answer against the sum the
prompt spells ("3 7 + 4 5 ="), independently of the environment. It has no dependencies, so
it deploys to AWS Lambda as is (handler `arithmetic_verifier.handler`, Python 3.11+), or runs
locally: `rollart lambda-local --function verify=arithmetic_verifier:handler` from this folder.

Run config:
    [domains.arithmetic.reward]
    kind = "lambda"
    function = "verify"
    endpoint_url = "http://127.0.0.1:9001"   # leave out for AWS (region = "...")
"""


def spelled_number(text: str) -> int | None:
    compact = "".join(text.split())
    return int(compact) if compact.isdigit() else None


def handler(event: dict, context: object) -> dict:
    terms = event["prompt"].rstrip("= ").split("+")
    numbers = [spelled_number(term) for term in terms]
    if None in numbers:
        raise ValueError(f"not an arithmetic prompt: {event['prompt']!r}")
    correct = spelled_number(event["response"]) == sum(numbers)
    return {"reward": 1.0 if correct else 0.0, "success": correct}
