"""Common lowercase English words, by length, for the `reasoning` and `general` families.

Kept in code rather than a data file because the families pick by length, and a tuple per length
is what they need.
"""

from __future__ import annotations

import random

WORDS: dict[int, tuple[str, ...]] = {
    3: tuple("cat dog sun hat pen cup box bus car egg fox map owl pig red sea sky toy van web ant bee "
             "cow jam key leg net pot rat tea zoo bag bed fan fig ice ink jar kit log mud nut".split()),
    4: tuple("fish bird tree book cake door frog gold hill king lamp milk moon nest rain ship star wind "
             "wolf bear boat coat drum farm fire game home lake leaf lion mask nose park ring rose sand "
             "snow song".split()),
    5: tuple("apple beach bread chair cloud dance eagle earth field flame ghost grape heart horse house "
             "juice knife lemon money mouse night ocean paper piano plant queen river robot sheep smile "
             "snake stone sugar table tiger train water whale".split()),
    6: tuple("animal banana basket bottle bridge butter camera candle carpet castle circle cookie dragon "
             "flower forest garden guitar hammer island jacket kitten ladder letter market mirror monkey "
             "orange parrot pencil pillow planet pocket rabbit rocket silver spider summer tomato window "
             "winter".split()),
    7: tuple("balloon blanket cabbage captain chicken diamond dolphin rainbow freedom giraffe kitchen "
             "lantern library morning octopus package panther penguin picture pumpkin station sunrise "
             "teacher thunder tractor uniform volcano whistle".split()),
    8: tuple("airplane alphabet backpack baseball birthday blizzard building calendar carousel dinosaur "
             "elephant envelope festival football hospital mountain notebook painting pancakes sandwich "
             "scissors squirrel sunshine treasure umbrella vacation".split()),
    9: tuple("astronaut butterfly chocolate crocodile dandelion furniture hamburger pineapple raspberry "
             "snowflake spaceship telescope waterfall adventure blueberry character".split()),
    10: tuple("basketball lighthouse strawberry watermelon tambourine motorcycle helicopter friendship "
              "toothbrush playground".split()),
}


def pick_word(rng: random.Random, shortest: int, longest: int) -> str:
    """A word of `shortest`..`longest` letters, every word in that range equally likely."""
    pool = [word for length in range(shortest, longest + 1) for word in WORDS[length]]
    return rng.choice(pool)
