"""The reward function of examples/openrlhf_grpo.py, a file OpenRLHF loads from ``--reward.remote_url``.

OpenRLHF calls ``reward_func(queries, prompts, labels)`` in its rollout actors with each sample's full text
(prompt + response), its prompt and its label. It returns ``rewards`` (what the advantages use),
``scores`` (what dynamic filtering and the selector read; ``--selector.reward_key reward`` reports
``rewards`` instead) and ``extra_logs``. Here both are the verifiable reward: 1.0 when the text after
the response's ``####`` is the label (GSM8K's answer format).
"""

import torch


def reward_func(queries, prompts, labels):
    scores = []
    for query, prompt, label in zip(queries, prompts, labels, strict=True):
        response = query[len(prompt) :] if query.startswith(prompt) else query
        answer = response.split("####")[-1].split("<")[0].strip() if "####" in response else None
        scores.append(1.0 if answer == str(label).strip() else 0.0)
    scores = torch.tensor(scores)
    return {"rewards": scores, "scores": scores, "extra_logs": {}}
