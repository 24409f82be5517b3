"""Workload prompts that carry a Predicted Outputs `prediction`: parsed, validated and sent."""

from __future__ import annotations

import pytest

from proxy.bench.workloads import WorkloadError, load, parse_workload

ENTRY = {"kind": "chat", "text": "Rename x to y:\nx = 1\n", "temperature": 0, "max_tokens": 8}


def test_the_code_editing_workload_predicts_its_original_code() -> None:
    plain, predicted = load("code_editing"), load("code_editing_predicted")
    assert [p.messages for p in predicted.prompts] == [p.messages for p in plain.prompts]  # the same requests
    for prompt in predicted.prompts:
        assert prompt.prediction and prompt.prediction in prompt.messages[0]["content"]
        assert prompt.body("m")["prediction"] == {"type": "content", "content": prompt.prediction}
    assert all("prediction" not in p.body("m") for p in plain.prompts)


@pytest.mark.parametrize(("prediction", "error"), [
    ("x = 1\n", None),
    ("", "prediction must be a non-empty string"),
    (["x"], "prediction must be a non-empty string"),
])
def test_a_prediction_is_a_non_empty_string(prediction: object, error: str | None) -> None:
    raw = {"name": "w", "description": "", "prompts": [{**ENTRY, "prediction": prediction}] * 10}
    if error is None:
        assert parse_workload(raw, "w").prompts[0].prediction == prediction
    else:
        with pytest.raises(WorkloadError, match=error):
            parse_workload(raw, "w")
