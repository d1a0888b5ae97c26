"""The example's tasks: short questions for the `one_word` environment ("answer with exactly one word").

SmolLM2-135M answers such a question in one word about one time in ten at temperature 1 and usually rambles
otherwise: a format a few policy-gradient steps can teach, with enough spread inside each group to learn from.
"""

from __future__ import annotations

import random

from gymflow.kernel.wire import ChatMessage, Task

# (question, choices, the correct choice)
QUESTIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Is fire hot?", ("yes", "no"), "yes"),
    ("Is ice cold?", ("yes", "no"), "yes"),
    ("Can fish swim?", ("yes", "no"), "yes"),
    ("Do cats bark?", ("yes", "no"), "no"),
    ("Is the sun a star?", ("yes", "no"), "yes"),
    ("Is water wet?", ("yes", "no"), "yes"),
    ("Can a stone fly?", ("yes", "no"), "no"),
    ("Is snow white?", ("yes", "no"), "yes"),
    ("What color is the sky on a clear day?", ("blue", "green", "red"), "blue"),
    ("What color is grass?", ("green", "purple", "orange"), "green"),
    ("What color is a ripe banana?", ("yellow", "blue", "black"), "yellow"),
    ("What color is milk?", ("white", "red", "green"), "white"),
    ("Which is bigger, a cat or an elephant?", ("cat", "elephant"), "elephant"),
    ("Which is faster, a snail or a horse?", ("snail", "horse"), "horse"),
    ("Which is heavier, a feather or a brick?", ("feather", "brick"), "brick"),
    ("Which animal says moo?", ("cow", "dog", "duck"), "cow"),
    ("Which animal barks?", ("dog", "cow", "fish"), "dog"),
    ("Which season is the coldest?", ("winter", "summer", "spring"), "winter"),
    ("What do bees make?", ("honey", "milk", "bread"), "honey"),
    ("What do you drink when you are thirsty?", ("water", "sand", "paper"), "water"),
    ("Which planet do we live on?", ("earth", "mars", "venus"), "earth"),
    ("What is frozen water called?", ("ice", "steam", "smoke"), "ice"),
    ("Which fruit is red?", ("strawberry", "banana", "lemon"), "strawberry"),
    ("What do you use to write on paper?", ("pen", "spoon", "shoe"), "pen"),
)


def make_task(i: int) -> Task:
    question, choices, answer = QUESTIONS[i]
    prompt = f"{question} Answer with exactly one word: {' or '.join(choices)}."
    return Task(id=f"q{i:02d}", env="one_word", messages=(ChatMessage(role="user", content=prompt),),
                data={"choices": list(choices), "answer": answer}, max_turns=1)


def step_tasks(step: int, groups: int, seed: int = 0) -> list[Task]:
    """`groups` distinct tasks for `step` (1-based): a seeded shuffle per pass over the questions, so every
    question comes round equally often and a rerun picks the same tasks."""
    if not 1 <= groups <= len(QUESTIONS):
        raise ValueError(f"--groups must be between 1 and {len(QUESTIONS)}, got {groups}")
    picked: list[int] = []
    start = (step - 1) * groups
    for k in range(start, start + groups):
        order = list(range(len(QUESTIONS)))
        random.Random(f"grpo-local/{seed}/{k // len(QUESTIONS)}").shuffle(order)
        i = order[k % len(QUESTIONS)]
        if i not in picked:  # a pass boundary can repeat a question within one step: skip it
            picked.append(i)
    k = start + groups
    while len(picked) < groups:  # top up from the next pass
        order = list(range(len(QUESTIONS)))
        random.Random(f"grpo-local/{seed}/{k // len(QUESTIONS)}").shuffle(order)
        if (i := order[k % len(QUESTIONS)]) not in picked:
            picked.append(i)
        k += 1
    return [make_task(i) for i in picked]
