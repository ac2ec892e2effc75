#!/usr/bin/python3
"""variants.py - robustness variants of agent dialogues (issue 39's sets A-E).

Reads dialogues in gen.py's schema (JSONL: {"id", "turns": [{"role", "text"}],
"recall": [{"turn", "question_turn", "answer"}]}) and writes each one
transformed, with its recall entries rebuilt from the transformed turns: every
answer is still the exact text of its answer turn and a sentence of the
confirming turn of a live task (check_gen.check_sample holds), and turn indices
follow the turns wherever they moved.  Standard library only.

  variants.py --variant A|B|C|D|E [--in base.jsonl] [--out A.jsonl]
              [--max-bytes 1024] [--seed 0]

What the worker's text heuristic sees (`commitkv-dialogue --semantic
entities`, examples/llm/dialogues.c): a turn names an entity when one of its
words (split at space . , ? ! : ;) holds a digit, or starts with a capital
letter and is not the first word of a sentence; such a turn is a lasting fact,
every other turn filler, and a turn whose entity words a later turn all repeats
is demoted to filler.  The variants:

  A  facts the heuristic cannot see.  In every task turn (openings, the name
     given, tool turns, confirmations, questions and answers) names, cities,
     days and months are lower-cased, numbers spelled as words ("3 nights" ->
     "three nights", "March 5" -> "march fifth", "342" -> "three hundred
     forty-two"), and codes and order numbers written in letters (digit d ->
     the d-th letter from a: "KX4821" -> "kxeicb", "04512" -> "aefbc").  The
     rules are per word, so a value is written the same way everywhere it
     appears and the answers stay exact.  No task turn names an entity
     afterwards (entity_words() below, a port of the C rule, checks it).
     Chit-chat and filler are left as they are.
  B  filler that looks like facts.  Chit-chat and filler pairs are replaced by
     ones of about the same size holding digits and capitalised names, cities
     and days (the generator's vocabularies, never a word of the dialogue's own
     tasks); none of it is ever asked.
  C  A, then B.
  D  more rounds and more distance.  The model's window is 1024 positions
     (seq_len of agentlm.bin) and gen.py's dialogues already use up to 1000
     bytes (median about 966), so a dialogue cannot get longer in bytes: D
     spends the same window on more rounds.  Within each topic (between two
     shifts) the tasks come first, then short filler rounds ("ok" / "Okay.",
     the generator's shortest) in place of the chit-chat, padded up to
     --max-bytes, then the questions in their original order: every fact is
     asked after all of its topic's filler.
  E  read-backs and restatements.  After the confirmation of each task that
     is asked about later the user reads the booking back ("Just to check:
     Noor Moreau, Cairo, 3 nights, code KX4821?" - the code in half of them,
     so half repeat every entity word of the confirmation) and the assistant
     says "Yes, that is right." (or "Yes, correct.", "Yes."); for half the
     tasks one more restatement of a single fact ("So the hotel is in
     Cairo?" / "Yes.") comes later in the same topic.  None of these turns is
     asked about.

A variant that does not fit in --max-bytes bytes (BOS included; default 1024,
the model's window) loses, in this order: turns after its last answer,
chit-chat pairs from the end backwards, E's later restatements, then its last
question; the counts go to stderr.  Each dialogue draws from random.Random("<seed>:<variant>:<id>"),
so the output depends only on the input, the variant and --seed.

Meant for gen.py's output: chit-chat and filler are recognised by gen.py's
own phrases (FILLER_U, FILLER_A, CHAT), and elsewhere they are taken for task
turns (A rewrites them too, B and D leave them in place).
"""
import argparse
import json
import random
import re
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402

CHAT_U = {q for q, _ in gen.CHAT}
CHAT_A = {a for _, a in gen.CHAT}
TALK_U = set(gen.FILLER_U) | CHAT_U
TALK_A = set(gen.FILLER_A) | CHAT_A


def turn_bytes(role, text):
    return gen.turn_bytes(role, text)


# ---- the C heuristic, in Python (examples/llm/dialogues.c: entity_words) ----

def entity_words(text):
    """The words of a turn that examples/llm/dialogues.c counts as entities."""
    out, start = [], True
    for w in re.split(r"([ .,?!:;])", text):
        if w in (" ", ",", ":", ";", ""):
            continue
        if w in (".", "?", "!"):
            start = True
            continue
        if len(w) >= 2 and (any(c.isdigit() for c in w) or (not start and "A" <= w[0] <= "Z")):
            out.append(w)
        start = False
    return out


# ---- dialogues as blocks --------------------------------------------------

class Block:
    """Consecutive turns of one kind: sys, task, qa (question + answer),
    shift, talk (a chit-chat or filler pair), said (a read-back pair that E
    inserts), restate (E's later restatement of one fact)."""

    def __init__(self, kind, turns):
        self.kind = kind
        self.turns = turns  # [(role, text)]

    def size(self):
        return sum(turn_bytes(r, t) for r, t in self.turns)


def to_blocks(d):
    turns = [(t["role"], t["text"]) for t in d["turns"]]
    qa_start = {r["question_turn"] for r in d["recall"]}
    blocks, i = [], 0
    while i < len(turns):
        role, text = turns[i]
        nxt = turns[i + 1] if i + 1 < len(turns) else None
        if role == "S":
            blocks.append(Block("sys", [turns[i]]))
            i += 1
        elif i in qa_start:
            blocks.append(Block("qa", turns[i:i + 2]))
            i += 2
        elif role == "U" and (text.startswith("Forget") or text.startswith("Never mind")) and nxt:
            blocks.append(Block("shift", turns[i:i + 2]))
            i += 2
        elif role == "U" and text in TALK_U and nxt and nxt[0] == "A" and nxt[1] in TALK_A:
            blocks.append(Block("talk", turns[i:i + 2]))
            i += 2
        else:  # a task's turns, up to and including its confirmation
            if not blocks or blocks[-1].kind != "task" or blocks[-1].turns[-1][1].startswith("Confirmed. "):
                blocks.append(Block("task", []))
            blocks[-1].turns.append(turns[i])
            i += 1
    return blocks


def from_blocks(ident, blocks):
    turns, recall = [], []
    for b in blocks:
        if b.kind == "qa":
            recall.append({"turn": len(turns) + 1, "question_turn": len(turns), "answer": b.turns[1][1]})
        turns.extend(b.turns)
    return {"id": ident, "turns": [{"role": r, "text": t} for r, t in turns], "recall": recall}


def total(blocks):
    return 1 + sum(b.size() for b in blocks)  # BOS


def fit(blocks, max_bytes, stats):
    """Cut blocks until the dialogue fits (the order in the module's doc)."""
    while total(blocks) > max_bytes:
        last_qa = max((i for i, b in enumerate(blocks) if b.kind == "qa"), default=-1)
        if last_qa < len(blocks) - 1:
            del blocks[-1]
            stats["tail_turns_cut"] = stats.get("tail_turns_cut", 0) + 1
            continue
        talk = [i for i, b in enumerate(blocks) if b.kind == "talk"]
        if talk:
            del blocks[talk[-1]]
            stats["talk_pairs_cut"] = stats.get("talk_pairs_cut", 0) + 1
            continue
        restated = [i for i, b in enumerate(blocks) if b.kind == "restate"]
        if restated:
            del blocks[restated[-1]]
            stats["restatements_cut"] = stats.get("restatements_cut", 0) + 1
            continue
        del blocks[last_qa]
        stats["questions_cut"] = stats.get("questions_cut", 0) + 1
    return blocks


def confirmed_facts(text):
    """{fact kind: value} of a confirmation ("Confirmed. The stay is 3 nights. ...")."""
    facts = {}
    for s in text[len("Confirmed. "):].rstrip(".").split(". "):
        for prefix, kind in gen.KINDS:
            if s.startswith(prefix):
                v = s[len(prefix):]
                for unit in (" people", " nights", " dollars"):
                    if v.endswith(unit):
                        v = v[:-len(unit)]
                facts[kind] = v
    return facts


# ---- A: facts the heuristic cannot see ---------------------------------------

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
ORDINAL = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
           "nine": "ninth", "twelve": "twelfth"}


def number_words(n):
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")
    if n < 1000:
        return ONES[n // 100] + " hundred" + (" " + number_words(n % 100) if n % 100 else "")
    return number_words(n // 1000) + " thousand" + (" " + number_words(n % 1000) if n % 1000 else "")


def ordinal_words(n):
    w = number_words(n)
    head, _, last = w.rpartition("-")
    last = ORDINAL.get(last, last[:-1] + "ieth" if last.endswith("y") else last + "th")
    return head + "-" + last if head else last


def digit_letters(s):
    return "".join("abcdefghij"[int(c)] if c.isdigit() else c.lower() for c in s)


VOCAB_CAPS = set(gen.FIRST) | set(gen.LAST) | set(gen.CITIES) | set(gen.DAYS) | set(gen.MONTHS)
MONTH_RE = "|".join(gen.MONTHS)


def hide_values(text, lower):
    text = re.sub(r"\b[A-Z]{2}\d{4}\b", lambda m: digit_letters(m.group()), text)   # codes
    text = re.sub(r"\b\d{5}\b", lambda m: digit_letters(m.group()), text)            # order numbers
    text = re.sub(r"\b(%s) (\d{1,2})\b" % MONTH_RE,
                  lambda m: m.group(1).lower() + " " + ordinal_words(int(m.group(2))), text)  # dates
    text = re.sub(r"\d+", lambda m: number_words(int(m.group())), text)               # other numbers
    return re.sub(r"\b[A-Z][a-z]+\b", lambda m: m.group().lower() if m.group() in lower else m.group(), text)


def variant_a(blocks, r):
    fact_kinds = ("task", "qa")
    # Capitalised words to lower-case: the vocabularies' names, cities, days and
    # months, and any capitalised word inside a sentence of a task turn (a name
    # from elsewhere), everywhere in the task turns, so each stays one word.
    lower = set(VOCAB_CAPS)
    for b in blocks:
        if b.kind in fact_kinds:
            for _, t in b.turns:
                lower.update(w for w in entity_words(t) if w[0].isupper() and w.isalpha())
    for b in blocks:
        if b.kind in fact_kinds:
            b.turns = [(ro, hide_values(t, lower)) for ro, t in b.turns]
    return blocks


# ---- B: filler that looks like facts -----------------------------------------

# {F} first name, {L} last name, {C} city, {D} day, {n1} 1-9, {n2} 10-99,
# {n3} 100-999, {n4} 1000-19999, {hm} a time.  Never a task's sentence form.
LONG_TALK = [
    ("My friend {F} {L} lives in {C} now.", "Say hello to {F} from me."),
    ("I walked {n4} steps today.", "Well done, {n4} steps is a lot."),
    ("My cousin {F} turns {n2} on {D}.", "Happy birthday to {F} then!"),
    ("The bus {n2} to {C} was late again.", "Buses in {C} can be slow on {D}."),
    ("I watched {C} play on {D}, {n1} to {n1}.", "A close game, then."),
    ("{F} said the museum opens at {hm}.", "Museums in {C} often open around {hm}."),
    ("I read {n2} pages of a novel by {F} {L}.", "{n2} pages is a good start."),
    ("My neighbour {F} has {n1} cats.", "{n1} cats make a busy home."),
    ("It was {n2} degrees in {C} on {D}.", "That sounds warm for {C}."),
    ("Room {n3} at my office is too cold.", "Maybe ask {F} {L} to check the heating."),
    ("My train {F}{n3} leaves from platform {n1}.", "Platform {n1} is easy to find."),
    ("{F} and {F2} met in {C} in {n4}.", "What a nice story."),
]
SHORT_TALK = [
    ("ok, {F} says hi", "Hi to {F}."), ("thanks, back at {hm}", "Okay."), ("fine, {D} then", "Noted."),
    ("ok, gate {n2}", "Sure thing."), ("great, {n1} more", "Got it."), ("cool, see {F}", "Okay."),
    ("yes, {C} is nice", "Noted."), ("ok", "Okay, {F}."), ("thanks", "Noted, {n2} minutes."),
]


def fill(template, r, avoid):
    def pick(pool):
        choices = [w for w in pool if w not in avoid]
        return r.choice(choices or pool)
    vals = {"F": pick(gen.FIRST), "F2": pick(gen.FIRST), "L": pick(gen.LAST), "C": pick(gen.CITIES),
            "D": pick(gen.DAYS), "n1": str(r.randint(2, 9)), "n2": str(r.randint(10, 99)),
            "n3": str(r.randint(100, 999)), "n4": str(r.randint(1000, 19999)),
            "hm": "%d:%02d" % (r.randint(7, 21), r.choice((0, 15, 30, 45)))}
    return tuple(s.format(**vals) for s in template)


def variant_b(blocks, r, max_bytes):
    avoid = set()
    for b in blocks:
        if b.kind in ("task", "qa"):
            for _, t in b.turns:
                avoid.update(re.findall(r"[A-Za-z]+", t))
    for b in blocks:
        if b.kind != "talk":
            continue
        slack = max_bytes - total(blocks) + b.size()
        pools = [LONG_TALK, SHORT_TALK] if b.turns[0][1] in CHAT_U else [SHORT_TALK, LONG_TALK]
        for pool in pools:
            options = [fill(t, r, avoid) for t in pool]
            r.shuffle(options)
            options = [o for o in options if turn_bytes("U", o[0]) + turn_bytes("A", o[1]) <= slack]
            if options:
                b.turns = [("U", options[0][0]), ("A", options[0][1])]
                break
    return blocks


# ---- D: more rounds, more distance --------------------------------------------

SHORT_U = [w for w in gen.FILLER_U if len(w) <= 5]  # the generator's shortest fillers: more rounds
SHORT_A = [w for w in gen.FILLER_A if len(w) <= 7]


def short_talk(r):
    return Block("talk", [("U", r.choice(SHORT_U)), ("A", r.choice(SHORT_A))])


def variant_d(blocks, r, max_bytes):
    # topics: the blocks between two shifts (a shift closes its topic)
    topics, cur = [], []
    for b in blocks[1:]:
        cur.append(b)
        if b.kind == "shift":
            topics.append(cur)
            cur = []
    topics.append(cur)
    kept = [blocks[0]] + [b for b in blocks[1:] if b.kind != "talk"]
    budget = max_bytes - total(kept)
    asking = [t for t in topics if any(b.kind == "qa" for b in t)] or topics
    share = budget // max(1, len(asking))
    out = [blocks[0]]
    for t in topics:
        fillers, size = [], 0
        while any(t is x for x in asking):
            f = short_talk(r)
            if size + f.size() > share:
                break
            fillers.append(f)
            size += f.size()
        out += [b for b in t if b.kind == "task"] + fillers + [b for b in t if b.kind == "qa"] + \
               [b for b in t if b.kind == "shift"]
    return out


# ---- E: read-backs and restatements --------------------------------------------

READBACK = {  # task (by a fact kind it has) -> read-back without and with the code
    "booking_day": ("a table for {booking_people} on {booking_day}, under {booking_name}", ", code {booking_code}"),
    "flight_date": ("{flight_passenger} to {flight_city} on {flight_date}", ", ticket {flight_ticket}"),
    "order_item": ("{order_item} for {order_price} dollars", ", order number {order_number}"),
    "hotel_city": ("{hotel_name}, {hotel_city}, {hotel_nights} nights", ", code {hotel_code}"),
}
RESTATE = {
    "booking_day": "So the table is on {v}?", "booking_name": "So it is under {v}?",
    "booking_code": "So the code is {v}?", "booking_people": "So it is for {v} people?",
    "flight_date": "So I fly on {v}?", "flight_passenger": "So {v} is flying?",
    "flight_city": "So I am going to {v}?", "flight_ticket": "So the ticket is {v}?",
    "order_price": "So it costs {v} dollars?", "order_item": "So I ordered {v}?",
    "order_number": "So the order is {v}?", "hotel_name": "So the room is for {v}?",
    "hotel_city": "So the hotel is in {v}?", "hotel_code": "So the code is {v}?",
    "hotel_nights": "So I stay {v} nights?",
}
YES = ["Yes, that is right.", "Yes, correct.", "Yes."]


def variant_e(blocks, r):
    before = {}  # original block index -> restatement pairs to insert before it
    after = {}   # original block index -> the read-back pair that follows it
    for i, b in enumerate(blocks):
        if b.kind != "task" or not b.turns[-1][1].startswith("Confirmed. "):
            continue
        facts = confirmed_facts(b.turns[-1][1])
        key = next((k for k in READBACK if k in facts), None)
        asked = any(q.kind == "qa" and " " + q.turns[1][1] in b.turns[-1][1] for q in blocks[i + 1:])
        if key is None or not asked:
            continue  # read back only what is asked later: the window has no room for more
        head, code = READBACK[key]
        text = "Just to check: " + head.format(**facts) + (code.format(**facts) if r.random() < 0.5 else "") + "?"
        after[i] = Block("said", [("U", text), ("A", r.choice(YES))])
        if r.random() < 0.5:  # one fact said again later, before the topic ends
            end = next((j for j in range(i + 1, len(blocks)) if blocks[j].kind == "shift"), len(blocks))
            kind = r.choice(sorted(facts))
            before.setdefault(r.randint(i + 1, end), []).append(
                Block("restate", [("U", RESTATE[kind].format(v=facts[kind])), ("A", r.choice(YES))]))
    out = []
    for i in range(len(blocks) + 1):
        out += before.get(i, [])
        if i < len(blocks):
            out.append(blocks[i])
            if i in after:
                out.append(after[i])
    return out


# ---- what a set looks like -------------------------------------------------------

def fact_distance(d, rec):
    """Bytes from the fact's sentence to the answer, as examples/llm/dialogues.c
    counts them (dialogue_fact_position; BOS included), or None."""
    turns = d["turns"]
    pos, best = 1, None
    starts = []
    for t in turns:
        starts.append(pos)
        pos += turn_bytes(t["role"], t["text"])
    for i in range(rec["turn"]):
        t = turns[i]
        if t["role"] == "A" and t["text"] == rec["answer"]:
            continue
        k = t["text"].rfind(rec["answer"])
        if k >= 0:
            best = starts[i] + 3 + k
    return None if best is None else starts[rec["turn"]] + 3 - best


def describe(dialogues):
    """Dialogues, questions, mean turns and bytes, median and mean fact distance,
    and the share of turns the heuristic marks as naming an entity."""
    dist = sorted(x for d in dialogues for r in d["recall"] for x in [fact_distance(d, r)] if x is not None)
    turns = [t for d in dialogues for t in d["turns"]]
    n = max(1, len(dialogues))
    return {"dialogues": len(dialogues), "questions": sum(len(d["recall"]) for d in dialogues),
            "turns_mean": round(len(turns) / n, 1),
            "bytes_mean": round(sum(1 + len(gen.render(d)) for d in dialogues) / n, 1),
            "distance_median": dist[len(dist) // 2] if dist else None,
            "distance_mean": round(sum(dist) / len(dist), 1) if dist else None,
            "entity_turns": round(sum(1 for t in turns if entity_words(t["text"])) / max(1, len(turns)), 3)}


# ---- the command ----------------------------------------------------------------

def transform(d, variant, max_bytes=1024, seed=0, stats=None):
    stats = {} if stats is None else stats
    r = random.Random("%d:%s:%s" % (seed, variant, d["id"]))
    blocks = to_blocks(d)
    if variant in ("A", "C"):
        blocks = fit(variant_a(blocks, r), max_bytes, stats)
    if variant in ("B", "C"):
        blocks = variant_b(blocks, r, max_bytes)
    if variant == "D":
        blocks = variant_d(blocks, r, max_bytes)
    if variant == "E":
        blocks = variant_e(blocks, r)
    blocks = fit(blocks, max_bytes, stats)
    out = from_blocks(d["id"] + "-" + variant, blocks)
    for k in d:
        if k not in out:
            out[k] = d[k]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", required=True, choices="ABCDE")
    ap.add_argument("--in", dest="inp", default="-", help="input jsonl ('-' = stdin)")
    ap.add_argument("--out", default="-", help="output jsonl ('-' = stdout)")
    ap.add_argument("--max-bytes", type=int, default=1024, help="bytes per dialogue, BOS included (the model's window)")
    ap.add_argument("--seed", type=int, default=0, help="salt of the per-dialogue random draws")
    a = ap.parse_args()
    src = sys.stdin if a.inp == "-" else open(a.inp)
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    stats = {}
    n = 0
    for line in src:
        if line.strip():
            out.write(json.dumps(transform(json.loads(line), a.variant, a.max_bytes, a.seed, stats)) + "\n")
            n += 1
    if out is not sys.stdout:
        out.close()
    print("variants: %s: %d dialogues%s" % (a.variant, n, "".join(", %s %d" % kv for kv in sorted(stats.items()))),
          file=sys.stderr)


if __name__ == "__main__":
    main()
