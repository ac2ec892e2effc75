#!/usr/bin/python3
"""gen.py - seeded generator of multi-turn agent dialogues for a byte-level LM.

Writes one JSON object a line, in the schema of the public evaluation file
(../shared/models/agent-dialogues.jsonl): {"id", "turns": [{"role", "text"}],
"recall": [{"turn", "question_turn", "answer"}]}.  Roles: S system, U user,
A assistant, T tool.  Rendering for the model: BOS, then b"R: text\\n" per turn.

A dialogue holds one to three tasks (a table booking, a flight, an order, a
hotel).  The assistant turn that closes a task confirms its facts, one sentence
per fact in random order; later user turns ask for facts of live tasks and the
assistant repeats that fact's sentence exactly (these answer turns are the
"recall" entries).  Filler turns, chit-chat and explicit topic shifts sit in
between; a shift abandons every live task (its facts are never asked again) and
only then may a task of the same kind come back, so one task of each kind is
live at a time and every question has one right answer.  Each dialogue renders
to at most --max-bytes bytes (BOS included).

The vocabularies here (names, cities, items, chit-chat) were written for this
generator; the task phrasing (requests, questions, confirmation sentences)
follows the task definition in ../shared/models/README.md.  This program never
reads the public file: it is the evaluation set.

Auxiliary copy-curriculum samples (--copy-short, --copy-long; training only,
never evaluation) teach the model to look back: a user turn gives a random
code-like string ("Remember this: QF-7731 tulip 58."), filler follows, and a
later question must be answered by repeating it.  Short-range samples put the
question within ~60-200 bytes, long-range ones up to the end of the window.
They use the same schema, with "aux": "copy-short" or "copy-long".

Every sample i is drawn from its own random.Random("<seed>:<kind>:<i>"), so any
slice of the output can be regenerated alone, in any order, in parallel.

  gen.py --seed 1 --count 1000 --out train.jsonl [--copy-short N] [--copy-long N]
         [--max-bytes 1000] [--start I]
"""
import argparse
import json
import random
import sys

SYSTEM = "You are a helpful booking assistant. Answer questions from the conversation."

FIRST = [
    "Aiko", "Amara", "Anders", "Beatriz", "Bruno", "Chen", "Chiara", "Dario", "Dana", "Emeka",
    "Esther", "Farah", "Felix", "Gideon", "Greta", "Hana", "Hiro", "Ines", "Ivan", "Jonas",
    "Jun", "Kamal", "Katya", "Lars", "Leila", "Malik", "Marta", "Mateo", "Nadia", "Niko",
    "Olga", "Oscar", "Paulo", "Rania", "Rafael", "Sana", "Selin", "Soren", "Talia", "Tomas",
    "Uma", "Victor", "Wanda", "Yara", "Yusuf", "Zara", "Ezra", "Mina", "Arjun", "Lena",
    "Boris", "Clara", "Diego", "Freya", "Ravi", "Noor", "Pavel", "Sofia", "Theo", "Ada",
]
LAST = [
    "Abe", "Alvarez", "Andersen", "Bauer", "Brandt", "Castro", "Chowdhury", "Dias", "Eriksen",
    "Fischer", "Fontaine", "Garcia", "Gupta", "Hansen", "Horvat", "Ito", "Jensen", "Kaur",
    "Kowalski", "Lindqvist", "Lopez", "Mendes", "Moretti", "Nakamura", "Nielsen", "Oduya",
    "Park", "Petrov", "Quispe", "Ramos", "Reyes", "Sandoval", "Schmidt", "Shah", "Sorensen",
    "Takahashi", "Torres", "Varga", "Vidal", "Walsh", "Yilmaz", "Zhou", "Mensah", "Laine",
    "Dubois", "Hoffmann", "Kim", "Lee", "Popescu", "Santos", "Moreno", "Arslan", "Novak",
]
CITIES = [
    "Amman", "Athens", "Austin", "Baku", "Bergen", "Bogota", "Bordeaux", "Boston", "Bremen",
    "Brno", "Busan", "Cork", "Dallas", "Delhi", "Denver", "Doha", "Dublin", "Durban", "Fes",
    "Genoa", "Ghent", "Graz", "Hamburg", "Havana", "Helsinki", "Istanbul", "Izmir", "Kobe",
    "Krakow", "Leeds", "Lisbon", "Lagos", "Madrid", "Malmo", "Manila", "Milan", "Montreal",
    "Mumbai", "Munich", "Nairobi", "Nantes", "Osaka", "Ottawa", "Palermo", "Prague", "Rome",
    "Santiago", "Seville", "Sofia", "Sydney", "Tallinn", "Tbilisi", "Toronto", "Tunis",
    "Turin", "Valencia", "Vienna", "Vilnius", "Warsaw", "Zagreb", "Zurich", "Oslo", "Tokyo",
    "Quito", "Kigali", "Hobart", "Malaga", "Minsk", "Bilbao", "Lyon", "Cusco", "Hue",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
COLORS = ["red", "blue", "green", "black", "white", "grey", "yellow", "purple", "brown",
          "pink", "navy", "beige", "gold", "teal", "orange", "silver"]
ITEMS = ["lamp", "chair", "kettle", "backpack", "helmet", "blender", "toaster", "mirror",
         "scarf", "umbrella", "sofa", "guitar", "drone", "monitor", "keyboard", "mug", "rug",
         "clock", "tablet", "headset", "stroller", "suitcase", "fan", "heater", "bottle"]
WORDS = ["tulip", "anchor", "maple", "comet", "harbor", "violet", "falcon", "pepper",
         "marble", "cedar", "lantern", "orbit", "saffron", "willow", "quartz", "ember",
         "canyon", "pebble", "meadow", "glacier", "cobalt", "thistle", "juniper", "nutmeg"]

FILLER_U = ["ok", "thanks", "sure", "great", "nice", "perfect", "understood", "okay then",
            "right", "good", "thank you", "wonderful", "all good", "hm", "yes please", "fine",
            "got it", "alright", "cool", "yes"]
FILLER_A = ["Okay.", "Noted.", "You're welcome.", "Glad to help.", "Anytime.", "Sure thing.",
            "Of course.", "Great.", "All set.", "Happy to help.", "Got it."]
CHAT = [
    ("What is your favorite color?", "I like deep blue, like the sea at dusk."),
    ("Can you tell me a joke?", "Why did the bicycle fall over? It was two tired."),
    ("Is it going to rain tomorrow?", "I cannot check the forecast, but an umbrella never hurts."),
    ("I just adopted a puppy.", "How lovely. Puppies need lots of sleep and patience."),
    ("What should I cook tonight?", "A simple pasta with garlic and olive oil is quick and good."),
    ("Do you know any poems?", "Roses are red, violets are blue, I am here to help you."),
    ("I feel a bit stressed.", "Take a slow breath. One thing at a time is enough."),
    ("What is the capital of Peru?", "The capital of Peru is Lima."),
    ("How do I fall asleep faster?", "Dim the lights and keep the phone away for an hour."),
    ("Which sport do you like?", "Tennis is fun to watch. The long rallies are exciting."),
    ("My plants keep dying.", "Most plants suffer from too much water. Let the soil dry first."),
    ("Tell me about the moon.", "The moon is slowly drifting away from Earth, a few centimeters a year."),
    ("I started running this week.", "Well done. Start slow and rest between runs."),
    ("Can you sing?", "Not really, but I can hum in text: hmm hmm hmm."),
    ("What time is it?", "I have no clock here, sorry."),
    ("Recommend a movie.", "A quiet drama on a rainy evening is hard to beat."),
    ("I love hiking.", "Hiking is great. Bring water and good shoes."),
    ("Is tea healthy?", "Green tea is fine for most people in normal amounts."),
    ("How far is the sun?", "About 150 million kilometers from Earth."),
    ("I lost my keys again.", "Try a small bowl by the door for them."),
    ("Do you dream?", "I do not dream, but I like to hear about yours."),
    ("What is a good hobby?", "Drawing is relaxing and needs only a pencil."),
    ("My cat ignores me.", "Cats show love in quiet ways. Give it time."),
    ("Any advice for learning a language?", "A little every day beats a lot once a week."),
    ("It is my birthday today!", "Happy birthday! I hope it is a great one."),
    ("What is your name?", "I am your booking assistant."),
    ("Do you like pizza?", "I cannot eat, but many people love a thin crust."),
    ("I am bored.", "Maybe a short walk or a puzzle would help."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("Should I learn to code?", "Coding is a useful skill. Start with a small project."),
]
SHIFT_U = ["Forget that, let us do something else.", "Never mind that, let us do something else.",
           "Forget that, something else now."]
SHIFT_A = ["No problem.", "Sure, no problem.", "Alright."]


# fact kind from the answer sentence (the task's fixed sentence forms)
KINDS = [("The table is on ", "booking_day"), ("The booking is under ", "booking_name"),
         ("Your booking code is ", "booking_code"), ("The table is for ", "booking_people"),
         ("The flight is on ", "flight_date"), ("The passenger is ", "flight_passenger"),
         ("You fly to ", "flight_city"), ("Your ticket number is ", "flight_ticket"),
         ("The price is ", "order_price"), ("You ordered ", "order_item"),
         ("Your order number is ", "order_number"), ("The reservation is for ", "hotel_name"),
         ("The hotel is in ", "hotel_city"), ("Your reservation code is ", "hotel_code"),
         ("The stay is ", "hotel_nights")]


def fact_kind(answer):
    for p, k in KINDS:
        if answer.startswith(p):
            return k
    return "note" if " note is " in answer else "other"


# Share of names, cities, colours and items made up from random syllables
# instead of the vocabularies above (train.py --novel-values).  A model that
# has seen only a few hundred names learns to recall them from its weights and
# half-copies the unseen ones ("Dmitro" for "Dmitri"); made-up values can only
# be copied.  0 draws nothing extra: the data of a seed stays as it was.
NOVEL_SHARE = 0.0

# Relative weights of the task kinds when a task starts (train.py
# --task-weights), e.g. {"flight": 2.0}: kinds not named weigh 1.  None draws
# uniformly, as before: the data of a seed stays as it was.
TASK_WEIGHTS = None


def novel(r, lo=2, hi=3):
    """A pronounceable made-up word of lo..hi syllables, lower case."""
    w = ""
    for _ in range(r.randint(lo, hi)):
        w += r.choice("bcdfghjklmnprstvwyz") + r.choice("aeiouy")
        if r.random() < 0.3:
            w += r.choice("nrslmkt")
    return w


def made_up(r):
    return NOVEL_SHARE > 0 and r.random() < NOVEL_SHARE


def person(r):
    if made_up(r):
        return novel(r).capitalize() + " " + novel(r).capitalize()
    return r.choice(FIRST) + " " + r.choice(LAST)


def city_name(r):
    return novel(r).capitalize() if made_up(r) else r.choice(CITIES)


def colour(r):
    return novel(r, 1, 2) if made_up(r) else r.choice(COLORS)


def item_name(r):
    return novel(r) if made_up(r) else r.choice(ITEMS)


def code(r):
    return "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2)) + "%04d" % r.randrange(10000)


def weighted(r, canonical, variants, p_canonical=0.7):
    """The canonical phrasing (the task's own) most of the time, a paraphrase otherwise."""
    return canonical if not variants or r.random() < p_canonical else r.choice(variants)


def make_task(r, kind):
    """One task: the turns that open and close it, and its facts as
    (fact kind, sentence, canonical question, paraphrases)."""
    if kind == "booking":
        n, day, name, c = r.randint(1, 12), r.choice(DAYS), person(r), code(r)
        opening = [("U", weighted(r, "I need a table for %d on %s." % (n, day),
                                  ["Book a table for %d on %s." % (n, day),
                                   "Can I get a table for %d on %s?" % (n, day)])),
                   ("A", "Sure. What name should I use?"), ("U", name + ".")]
        facts = [("booking_day", "The table is on %s." % day, "Which day is the table?",
                  ["What day is my table?", "When is the table?"]),
                 ("booking_name", "The booking is under %s." % name, "What name is the booking under?",
                  ["Whose name is the booking under?"]),
                 ("booking_code", "Your booking code is %s." % c, "What is my booking code?",
                  ["Can you repeat my booking code?", "What was the booking code?"]),
                 ("booking_people", "The table is for %d people." % n, "How many people is the table for?",
                  ["For how many people is the table?"])]
    elif kind == "flight":
        city, month, d, name, c = city_name(r), r.choice(MONTHS), r.randint(1, 28), person(r), code(r)
        date = "%s %d" % (month, d)
        opening = [("U", weighted(r, "Book me a flight to %s on %s." % (city, date),
                                  ["I need a flight to %s on %s." % (city, date)])),
                   ("A", "Who is the passenger?"), ("U", name + "."),
                   ("T", "flight_search: %s %s seats=ok" % (city, date))]
        facts = [("flight_date", "The flight is on %s." % date, "What date is the flight?",
                  ["When is my flight?", "On which date do I fly?"]),
                 ("flight_passenger", "The passenger is %s." % name, "Who is the passenger?",
                  ["Who is flying?"]),
                 ("flight_city", "You fly to %s." % city, "Where am I flying to?",
                  ["Where does my flight go?"]),
                 ("flight_ticket", "Your ticket number is %s." % c, "What is my ticket number?",
                  ["Can you repeat my ticket number?"])]
    elif kind == "order":
        color, item, price = colour(r), item_name(r), r.randint(10, 999)
        num = "%05d" % r.randrange(100000)
        opening = [("U", weighted(r, "I want to order a %s %s." % (color, item),
                                  ["Please order a %s %s for me." % (color, item)])),
                   ("T", "catalog: %s %s price=%d" % (color, item, price))]
        facts = [("order_price", "The price is %d dollars." % price, "How much was it?",
                  ["What did it cost?", "What was the price?"]),
                 ("order_item", "You ordered a %s %s." % (color, item), "What did I order?",
                  ["What was my order?"]),
                 ("order_number", "Your order number is %s." % num, "What is my order number?",
                  ["Can you repeat my order number?"])]
    else:
        city, n, name, c = city_name(r), r.randint(1, 14), person(r), code(r)
        opening = [("U", weighted(r, "I need a hotel in %s for %d nights." % (city, n),
                                  ["Find me a hotel in %s for %d nights." % (city, n)])),
                   ("A", "What name for the reservation?"), ("U", name + ".")]
        facts = [("hotel_name", "The reservation is for %s." % name, "Who is the reservation for?",
                  ["Whose name is the reservation under?"]),
                 ("hotel_city", "The hotel is in %s." % city, "Which city is the hotel in?",
                  ["Where is the hotel?"]),
                 ("hotel_code", "Your reservation code is %s." % c, "What is my reservation code?",
                  ["Can you repeat my reservation code?"]),
                 ("hotel_nights", "The stay is %d nights." % n, "How many nights?",
                  ["How long is the stay?"])]
    order = facts[:]
    r.shuffle(order)
    confirm = ("A", "Confirmed. " + " ".join(f[1] for f in order))
    return opening + [confirm], facts


def turn_bytes(role, text):
    return len(role) + 2 + len(text.encode()) + 1


class Builder:
    """A dialogue being written, with its byte count and recall entries."""

    def __init__(self, max_bytes):
        self.turns = [("S", SYSTEM)]
        self.recall = []
        self.size = 1 + turn_bytes("S", SYSTEM)  # BOS + system turn
        self.max_bytes = max_bytes

    def fits(self, turns):
        return self.size + sum(turn_bytes(ro, t) for ro, t in turns) <= self.max_bytes

    def add(self, turns):
        for ro, t in turns:
            self.turns.append((ro, t))
            self.size += turn_bytes(ro, t)

    def ask(self, question, answer):
        qt = len(self.turns)
        self.add([("U", question), ("A", answer)])
        self.recall.append({"turn": qt + 1, "question_turn": qt, "answer": answer})

    def record(self, ident, extra=None):
        d = {"id": ident, "turns": [{"role": ro, "text": t} for ro, t in self.turns],
             "recall": self.recall}
        if extra:
            d.update(extra)
        return d


def small_talk(r):
    if r.random() < 0.5:
        return [("U", r.choice(FILLER_U)), ("A", r.choice(FILLER_A))]
    q, a = r.choice(CHAT)
    return [("U", q), ("A", a)]


def dialogue(r, ident, max_bytes):
    b = Builder(max_bytes)
    live = {}  # kind -> facts of the live task of that kind
    n_tasks = 0
    while True:
        # Start a task when none is live, or sometimes beside the live ones.
        free = [k for k in ("booking", "flight", "order", "hotel") if k not in live]
        if free and n_tasks < 3 and (not live or r.random() < 0.22):
            if TASK_WEIGHTS is None:
                kind = r.choice(free)
            else:
                kind = r.choices(free, weights=[TASK_WEIGHTS.get(k, 1.0) for k in free])[0]
            turns, facts = make_task(r, kind)
            if not b.fits(turns):
                break
            b.add(turns)
            live[kind] = facts
            n_tasks += 1
            continue
        x = r.random()
        if live and x < 0.45:
            facts = live[r.choice(sorted(live))]
            f = r.choice(facts)
            q = f[2] if r.random() < 0.75 else r.choice(f[3])
            if not b.fits([("U", q), ("A", f[1])]):
                break
            b.ask(q, f[1])
        elif live and n_tasks < 3 and x < 0.53:
            turns = [("U", r.choice(SHIFT_U)), ("A", r.choice(SHIFT_A))]
            if not b.fits(turns):
                break
            b.add(turns)
            live = {}
        else:
            turns = small_talk(r)
            if not b.fits(turns):
                # a shorter filler may still fit; stop otherwise
                turns = [("U", "ok"), ("A", "Okay.")]
                if not b.fits(turns) or r.random() < 0.5:
                    break
            b.add(turns)
    return b.record(ident)


def copy_sample(r, ident, max_bytes, long_range):
    """A copy-curriculum sample: remember a random string, answer it back later."""
    b = Builder(max_bytes)
    items = []
    for _ in range(r.randint(1, 3)):
        s = "%s-%d %s %d" % (code(r), r.randrange(100), r.choice(WORDS), r.randrange(1000))
        items.append(s)
    labels = ["first", "second", "third"]
    # The assistant confirms with the very sentence a later answer repeats (as a
    # dialogue's confirmation turn does): a copy a few bytes back first, the
    # same copy from far back later, which is what teaches the model to look back.
    for i, s in enumerate(items):
        b.add([("U", "Remember the %s note: %s." % (labels[i], s)), ("A", "The %s note is %s." % (labels[i], s))])
    gap = (r.randint(0, 2) if not long_range else r.randint(4, 14))
    for _ in range(gap):
        t = small_talk(r)
        if b.fits(t):
            b.add(t)
    while True:
        i = r.randrange(len(items))
        q, a = "What was the %s note?" % labels[i], "The %s note is %s." % (labels[i], items[i])
        if not b.fits([("U", q), ("A", a)]):
            break
        b.ask(q, a)
        if not long_range and r.random() < 0.3:
            break
        for _ in range(r.randint(0, 3 if long_range else 1)):
            t = small_talk(r)
            if b.fits(t):
                b.add(t)
    return b.record(ident, {"aux": "copy-long" if long_range else "copy-short"})


def render(d):
    """The bytes a model sees after BOS."""
    return "".join("%s: %s\n" % (t["role"], t["text"]) for t in d["turns"]).encode()


def sample(seed, kind, i, max_bytes=1000):
    """Sample i of one kind ("dialogue", "copy-short", "copy-long") for this seed."""
    r = random.Random("%d:%s:%d" % (seed, kind, i))
    if kind == "dialogue":
        return dialogue(r, "g%d-%06d" % (seed, i), max_bytes)
    tag = "cs" if kind == "copy-short" else "cl"
    return copy_sample(r, "%s%d-%06d" % (tag, seed, i), max_bytes, kind == "copy-long")


def generate(seed, count, start=0, copy_short=0, copy_long=0, max_bytes=1000):
    for i in range(start, start + count):
        yield sample(seed, "dialogue", i, max_bytes)
    for i in range(copy_short):
        yield sample(seed, "copy-short", i, max_bytes)
    for i in range(copy_long):
        yield sample(seed, "copy-long", i, max_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100, help="dialogues")
    ap.add_argument("--start", type=int, default=0, help="index of the first dialogue")
    ap.add_argument("--copy-short", type=int, default=0, help="short-range copy samples (training only)")
    ap.add_argument("--copy-long", type=int, default=0, help="long-range copy samples (training only)")
    ap.add_argument("--max-bytes", type=int, default=1000, help="bytes per dialogue, BOS included")
    ap.add_argument("--out", default="-", help="output jsonl ('-' = stdout)")
    a = ap.parse_args()
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    for d in generate(a.seed, a.count, a.start, a.copy_short, a.copy_long, a.max_bytes):
        out.write(json.dumps(d) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
