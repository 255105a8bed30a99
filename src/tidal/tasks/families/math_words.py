"""`math_word`: multi-step word problems in varied wording, checked by the `math` verifier.

Each scenario (shopping, savings, travel, recipes, ages, discounts, ...) is told in two or three
phrasings with varied names and objects, and takes two to four arithmetic steps. Difficulty sets
the size of the numbers (units at level 1, thousands at level 5) and adds steps (a change to give,
a discount, a share to split). Answers are whole numbers by construction. The reference is the
worked solution, one short line per step, ending "Answer: N". The content key is the scenario and
its numbers, so an eval problem is new numbers (or a scenario's new combination) in any wording.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tidal.tasks.families.registry import Draft, family

NAMES = ("Ana", "Ben", "Chloe", "Dev", "Elif", "Farah", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Marco",
         "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Uma", "Victor", "Wen", "Yusuf", "Zoe")
GOODS = (("notebook", "notebooks"), ("pencil", "pencils"), ("mug", "mugs"), ("ticket", "tickets"),
         ("lamp", "lamps"), ("shirt", "shirts"), ("plant", "plants"), ("puzzle", "puzzles"))
BAKES = ("muffins", "cookies", "rolls", "tarts", "bagels")
# Largest typical number per level: units, tens, hundreds, ..., thousands.
SCALE = {1: 9, 2: 30, 3: 120, 4: 600, 5: 5000}

Problem = tuple[str, str, list[str], int]  # (content key, prompt, worked steps, answer)


def size(rng: random.Random, level: int, low: int = 2) -> int:
    return rng.randint(low, max(low + 1, SCALE[level]))


def small(rng: random.Random, level: int) -> int:
    """A count or multiplier: stays small so products stay readable."""
    return rng.randint(2, 4 + 2 * level)


def shopping(rng: random.Random, level: int, name: str) -> Problem:
    (one, many), (one2, many2) = rng.sample(GOODS, 2)
    a, b = small(rng, level), small(rng, level)
    p, q = size(rng, level), size(rng, level)
    total = a * p + b * q
    steps = [f"{a} * {p} = {a * p}", f"{b} * {q} = {b * q}", f"{a * p} + {b * q} = {total}"]
    if level >= 3:
        paid = (total // 100 + 1) * 100
        steps.append(f"{paid} - {total} = {paid - total}")
        prompt = rng.choice((
            (f"{name} buys {a} {many} at ${p} each and {b} {many2} at ${q} each, and pays with ${paid}. "
            f"How much change does {name} get back?"),
            (f"A {one} costs ${p} and a {one2} costs ${q}. {name} hands the cashier ${paid} for {a} {many} and "
            f"{b} {many2}. How many dollars of change should {name} receive?"),
        ))
        return f"shop|{a}|{p}|{b}|{q}|{paid}", prompt, steps, paid - total
    prompt = rng.choice((
        f"{name} buys {a} {many} at ${p} each and {b} {many2} at ${q} each. How much does {name} spend in all?",
        f"A {one} costs ${p} and a {one2} costs ${q}. What is the total cost of {a} {many} and {b} {many2}?",
        (f"At the shop, {many} are ${p} apiece and {many2} are ${q} apiece. {name} takes {a} {many} and {b} {many2}. "
        "What is the bill?"),
    ))
    return f"shop|{a}|{p}|{b}|{q}", prompt, steps, total


def savings(rng: random.Random, level: int, name: str) -> Problem:
    weekly, weeks = size(rng, level), small(rng, level)
    start = size(rng, level, 0)
    saved = start + weekly * weeks
    spend = rng.randint(1, saved)
    steps = [f"{weekly} * {weeks} = {weekly * weeks}", f"{start} + {weekly * weeks} = {saved}",
             f"{saved} - {spend} = {saved - spend}"]
    prompt = rng.choice((
        (f"{name} has ${start} and saves ${weekly} every week for {weeks} weeks. Then {name} spends ${spend} on a "
        "bike. How much money is left?"),
        (f"Starting with ${start} in a jar, {name} adds ${weekly} each week. After {weeks} weeks, {name} takes out "
        f"${spend}. How many dollars are in the jar now?"),
        (f"{name}'s account holds ${start}. For {weeks} weeks a deposit of ${weekly} arrives, and then a ${spend} "
        "bill is paid. What is the balance?"),
    ))
    return f"save|{start}|{weekly}|{weeks}|{spend}", prompt, steps, saved - spend


def reading(rng: random.Random, level: int, name: str) -> Problem:
    per_day, days = rng.randint(3, 10 + 10 * level), small(rng, level)
    read = per_day * days
    left = size(rng, level, 1)
    pages = read + left
    steps = [f"{per_day} * {days} = {read}", f"{pages} - {read} = {left}"]
    prompt = rng.choice((
        (f"A book has {pages} pages. {name} reads {per_day} pages a day for {days} days. How many pages are still "
        "unread?"),
        (f"{name} is reading a {pages}-page novel at {per_day} pages per day. After {days} days, how many pages "
        "remain?"),
    ))
    return f"read|{pages}|{per_day}|{days}", prompt, steps, left


def travel(rng: random.Random, level: int, name: str) -> Problem:
    v, h = rng.randint(5, 20 + 20 * level), small(rng, level)
    u, g = rng.randint(5, 20 + 20 * level), rng.randint(1, 3 + level)
    steps = [f"{v} * {h} = {v * h}", f"{u} * {g} = {u * g}", f"{v * h} + {u * g} = {v * h + u * g}"]
    prompt = rng.choice((
        (f"A train travels at {v} km per hour for {h} hours, then at {u} km per hour for {g} hours. How many "
        "kilometres does it cover?"),
        (f"{name} cycles {h} hours at {v} km/h and then {g} hours at {u} km/h. What distance, in km, did "
        f"{name} ride?"),
    ))
    return f"travel|{v}|{h}|{u}|{g}", prompt, steps, v * h + u * g


def bakery(rng: random.Random, level: int, name: str) -> Problem:
    trays, per_tray = small(rng, level), small(rng, level) + 2
    made = trays * per_tray
    box = rng.choice((2, 3, 4, 6))
    boxes = rng.randint(1, max(1, made // box - 1))
    sold = made - boxes * box
    bake = rng.choice(BAKES)
    steps = [f"{trays} * {per_tray} = {made}", f"{made} - {sold} = {made - sold}", f"{made - sold} / {box} = {boxes}"]
    prompt = rng.choice((
        (f"A bakery makes {trays} trays of {per_tray} {bake}. It sells {sold} of them and packs the rest in boxes "
        f"of {box}. How many boxes does it fill?"),
        (f"{name} bakes {trays} batches with {per_tray} {bake} in each. After selling {sold}, {name} puts the "
        f"leftover {bake} into bags of {box}. How many bags are needed?"),
    ))
    return f"bake|{trays}|{per_tray}|{sold}|{box}", prompt, steps, boxes


def discount(rng: random.Random, level: int, name: str) -> Problem:
    percent = rng.choice((10, 20, 25, 50) if level < 5 else (5, 15, 30, 40, 60))
    price = rng.randint(1, max(2, SCALE[level] // 10)) * 20
    count = small(rng, level)
    off = price * percent // 100
    one = price - off
    steps = [f"{price} * {percent}% = {off}", f"{price} - {off} = {one}", f"{one} * {count} = {one * count}"]
    (item, items), = rng.sample(GOODS, 1)
    prompt = rng.choice((
        (f"A {item} normally costs ${price}. During a sale everything is {percent}% off. How much do {count} {items} "
        "cost in the sale?"),
        (f"{name} buys {count} {items} that are marked ${price} each, with a {percent}% discount. What does "
        f"{name} pay?"),
    ))
    return f"disc|{price}|{percent}|{count}", prompt, steps, one * count


def ages(rng: random.Random, level: int, name: str) -> Problem:
    other = rng.choice([n for n in NAMES if n != name])
    young = rng.randint(3, 10 + 5 * level)
    gap, later = rng.randint(1, 10 + 3 * level), rng.randint(1, 5 * level)
    total = young + later + young + gap + later
    steps = [f"{young} + {gap} = {young + gap}", f"{young} + {later} = {young + later}",
             f"{young + gap} + {later} = {young + gap + later}", f"{young + later} + {young + gap + later} = {total}"]
    prompt = rng.choice((
        (f"{name} is {young} years old and {other} is {gap} years older. What will the sum of their ages be in "
        f"{later} years?"),
        (f"{other} is {gap} years older than {name}, who is {young}. In {later} years, how old will they be "
        "together?"),
    ))
    return f"age|{young}|{gap}|{later}", prompt, steps, total


def fractions(rng: random.Random, level: int, name: str) -> Problem:
    part = rng.choice((2, 3, 4, 5))
    word = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}[part]
    group = rng.randint(2, max(3, SCALE[level] // part)) * part
    share = group // part
    absent = rng.randint(0, max(0, group - share - 1))
    steps = [f"{group} / {part} = {share}", f"{group} - {share} = {group - share}",
             f"{group - share} - {absent} = {group - share - absent}"]
    prompt = rng.choice((
        (f"A school club has {group} members. {word.capitalize()} of them are in the chess team, and {absent} of the "
        "others are away today. How many members who are not in the chess team are present?"),
        (f"There are {group} seats in a hall; {word} are reserved. Of the unreserved seats, {absent} are broken. "
        "How many unreserved seats can be used?"),
    ))
    return f"frac|{group}|{part}|{absent}", prompt, steps, group - share - absent


def wages(rng: random.Random, level: int, name: str) -> Problem:
    rate, hours, days = rng.randint(8, 15 + 10 * level), rng.randint(2, 8), rng.randint(2, 6)
    bonus = size(rng, level, 0)
    steps = [f"{hours} * {days} = {hours * days}", f"{rate} * {hours * days} = {rate * hours * days}",
             f"{rate * hours * days} + {bonus} = {rate * hours * days + bonus}"]
    prompt = rng.choice((
        f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days, plus a ${bonus} bonus. How "
        "much does {name} earn?".replace("{name}", name),
        (f"Paid ${rate} per hour, {name} worked {hours}-hour shifts on {days} days and got a bonus of ${bonus}. "
        "What was the total pay?"),
    ))
    return f"wage|{rate}|{hours}|{days}|{bonus}", prompt, steps, rate * hours * days + bonus


def collecting(rng: random.Random, level: int, name: str) -> Problem:
    other, third = rng.sample([n for n in NAMES if n != name], 2)
    first, times = size(rng, level), rng.randint(2, 4)
    fewer = rng.randint(1, first * times - 1)
    second, last = first * times, first * times - fewer
    steps = [f"{first} * {times} = {second}", f"{second} - {fewer} = {last}",
             f"{first} + {second} + {last} = {first + second + last}"]
    prompt = rng.choice((
        f"{name} collected {first} shells. {other} collected {times} times as many, and {third} collected {fewer} "
        "fewer than {other}. How many shells did the three collect?".replace("{other}", other),
        (f"On a walk, {name} picks {first} berries, {other} picks {times} times as many as {name}, and {third} picks "
        f"{fewer} fewer than {other}. How many berries in total?"),
    ))
    return f"collect|{first}|{times}|{fewer}", prompt, steps, first + second + last


def average(rng: random.Random, level: int, name: str) -> Problem:
    tests = rng.randint(3, 2 + level)
    target = rng.randint(60, 90)
    scores = [rng.randint(max(0, target - 15), min(100, target + 15)) for _ in range(tests - 1)]
    need = target * tests - sum(scores)
    if not 0 <= need <= 100:  # keep the answer a reachable score
        scores = [target] * (tests - 1)
        need = target
    listed = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    steps = [f"{target} * {tests} = {target * tests}", f"{' + '.join(map(str, scores))} = {sum(scores)}",
             f"{target * tests} - {sum(scores)} = {need}"]
    prompt = rng.choice((
        (f"{name} scored {listed} on the first {tests - 1} tests. What score is needed on test {tests} for an "
        f"average of exactly {target}?"),
        (f"After tests marked {listed}, {name} wants a mean of {target} over {tests} tests. What must the last "
        "test score be?"),
    ))
    return f"avg|{'|'.join(map(str, scores))}|{target}", prompt, steps, need


def warehouse(rng: random.Random, level: int, name: str) -> Problem:
    stock, loads, per_load = size(rng, level), rng.randint(2, 5), size(rng, level)
    shipped = rng.randint(1, stock + loads * per_load)
    steps = [f"{loads} * {per_load} = {loads * per_load}", f"{stock} + {loads * per_load} = {stock + loads * per_load}",
             f"{stock + loads * per_load} - {shipped} = {stock + loads * per_load - shipped}"]
    prompt = rng.choice((
        (f"A warehouse holds {stock} crates. It receives {loads} deliveries of {per_load} crates each and ships out "
        f"{shipped} crates. How many crates are in the warehouse now?"),
        (f"{name}'s shop had {stock} cans on the shelves. {loads} cartons of {per_load} cans were unpacked, then "
        f"{shipped} cans were sold. How many cans are left?"),
    ))
    return f"store|{stock}|{loads}|{per_load}|{shipped}", prompt, steps, stock + loads * per_load - shipped


def recipe(rng: random.Random, level: int, name: str) -> Problem:
    serves, factor = rng.choice((2, 3, 4, 6)), rng.randint(2, 3 + level)
    grams = size(rng, level, 5) * 10 if level >= 3 else size(rng, level, 5) * 5
    steps = [f"{serves} * {factor} = {serves * factor}", f"{grams} * {factor} = {grams * factor}"]
    prompt = rng.choice((
        (f"A recipe for {serves} people uses {grams} grams of flour. {name} is cooking for {serves * factor} people. "
        "How many grams of flour are needed?"),
        f"{grams} g of rice feeds {serves} guests. How many grams feed {serves * factor} guests?",
    ))
    return f"recipe|{serves}|{factor}|{grams}", prompt, steps, grams * factor


SCENARIOS: dict[str, Callable[[random.Random, int, str], Problem]] = {
    "shopping": shopping, "savings": savings, "reading": reading, "travel": travel, "bakery": bakery,
    "discount": discount, "ages": ages, "fractions": fractions, "wages": wages, "collecting": collecting,
    "average": average, "warehouse": warehouse, "recipe": recipe,
}


@family("math_word", domain="math")
def make_math_word(rng: random.Random, difficulty: int) -> Draft:
    scenario = rng.choice(tuple(SCENARIOS))
    key, prompt, steps, answer = SCENARIOS[scenario](rng, difficulty, rng.choice(NAMES))
    reference = "; ".join(steps) + f". Answer: {answer}"
    return Draft(key, prompt, reference, {"name": "math", "answer": str(answer)}, metadata={"scenario": scenario})
