"""The SentencePiece-style vocabulary of elsa-tune's written models (``tokenizer.ggml.model = "llama"``).

Ids 0–4 are ``<unk>``, ``<s>``, ``</s>``, ``<|im_start|>`` and ``<|im_end|>``; then the 256 byte-fallback
tokens ``<0x00>``…``<0xFF>``, so every text tokenizes; then the printable ASCII characters (a space is ``▁``);
then about 800 common English words, each with ``▁`` in front, together with every prefix of it. llama.cpp's
SPM tokenizer merges two adjacent pieces only when their concatenation is a token (highest score first), so the
prefixes give each word a chain of merges from its letters to the whole word and ordinary prose takes about
one token per word. The role names (``▁user``: llama.cpp puts a space in front of the text after a control token)
and the capitalised words without ``▁`` (a prompt's first word, after a newline) are pieces too, scored below
every word so they never split one.

``words`` lists the ids of the whole-word tokens: the only tokens a designed model ever answers with.
A *foreign* vocabulary holds the same pieces in another order: a draft model on it is not compatible with a
target on the ordinary one (llama.cpp compares the token text at every id from 5 on).
"""

from __future__ import annotations

from dataclasses import dataclass

UNK, BOS, EOS, IM_START, IM_END = 0, 1, 2, 3, 4

#: llama.cpp token types (``LLAMA_TOKEN_TYPE_*``)
NORMAL, UNKNOWN, CONTROL, UNUSED, BYTE = 1, 2, 3, 5, 6

CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")

_ROLES = ("user", "assistant", "system")

_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this from or had by hot
word but what some we can out other were all there when up use your how said an each she which do their time
if will way about many then them write would like so these her long make thing see him two has look more day
could go come did number sound no most people my over know water than call first who may down side been now
find any new work part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also play small end put home
read hand port large spell add even land here must big high such follow act why ask men change went light kind
off need house picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late run while press
close night real life few north open seem together next white children begin got walk example ease paper group
always music those both mark often letter until mile river car feet care second book carry took science eat
room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain
girl usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock order fire
south problem piece told knew pass since top whole king space heard best hour better true during hundred five
remember step early hold west ground interest reach fast verb sing listen six table travel less morning ten
simple several vowel toward war lay against pattern slow center love person money serve appear road map rain
rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine note wait plan
figure star box noun field rest correct able pound done beauty drive stood contain front teach week final gave
green quick develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate miss
brought heat snow tire bring yes distant fill east paint language among grand ball yet wave drop heart present
heavy dance engine position arm wide sail material size vary settle speak weight general ice matter circle pair
include divide syllable felt perhaps pick sudden count square reason length represent art subject region energy
hunt probable bed brother egg ride cell believe fraction forest sit race window store summer train sleep prove
lone exercise wall catch mount wish sky board joy winter sat written wild instrument kept glass grass cow job
edge sign visit past soft fun bright gas weather month million bear finish happy hope flower clothe strange gone
jump baby eight village meet root buy raise solve metal whether push seven paragraph third shall held hair
describe cook floor either result burn hill safe cat century consider type law bit coast copy phrase silent tall
sand soil roll temperature finger industry value fight lie beat excite natural view sense ear else quite broke
case middle kill son lake moment scale loud spring observe child straight consonant nation dictionary milk speed
method organ pay age section dress cloud surprise quiet stone tiny climb cool design poor lot experiment bottom
key iron single stick flat twenty skin smile crease hole trade melody trip office receive row mouth exact symbol
die least trouble shout except wrote seed tone join suggest clean break lady yard rise bad blow oil blood touch
grew cent mix team wire cost lost brown wear garden equal sent choose fell fit flow fair bank collect save
control decimal gentle woman captain practice separate difficult doctor please protect noon whose locate ring
character insect caught period indicate radio spoke atom human history effect electric expect crop modern
element hit student corner party supply bone rail imagine provide agree thus capital chair danger fruit rich
thick soldier process operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare poem
string bell depend meat rub tube famous dollar stream fear sight thin triangle planet hurry chief colony clock
mine tie enter major fresh search send yellow gun allow print dead spot desert suit current lift rose continue
block chart hat sell success company subtract event particular deal swim term opposite wife shoe shoulder spread
arrange camp invent cotton born determine quart nine truck noise level chance gather shop stretch throw shine
property column molecule select wrong gray repeat require broad prepare salt nose plural anger claim continent
oxygen sugar death pretty skill women season solution magnet silver thank branch match suffix especially fig
afraid huge sister steel discuss forward similar guide experience score apple bought led pitch coat mass card
band rope slip win dream evening condition feed tool total basic smell valley nor double seat arrive master
track parent shore division sheet substance favor connect post spend chord fat glad original share station dad
bread charge proper bar offer segment slave duck instant market degree populate chick dear enemy reply drink
occur support speech nature range steam motion path liquid log meant quotient teeth shell neck explain reasons
sunset bakery oven temperatures summarise rules player played python function returns fibonacci iteratively
shell lines file folder query customers ordered leaves arrives trip glorp zint steps rename git locally remote
translate ferry dawn french spanish lighthouse keeper counting ships race tiny access code vault number only
stamps album marbles jar jars groups remainder apples basket baskets coins purse notebooks pages crates tickets
harbour engineer cartographer beekeeper watched counted measured recorded painted repaired followed described
sorted carried grey tide copper bells northern ledger storms flats lanterns fog crate maps canal barley slept
turned lamps went pier amber basalt cobalt dune ember fjord garnet harbor indigo juniper answer hello thanks
"""

#: Capitalised forms of sentence starters, so a prompt's first word is one token too.
_CAPITALISED = """
The A An I It This That What Why How When Where Which Who Give Write Explain Summarise List Translate Think If
Each After About Reply Use Show Tell Find Make Describe Compare Name In On For Is Are Can Do Does Please Python SQL
Go French Spanish Fibonacci Ada Chen Lena
"""


def word_list(foreign: bool = False) -> tuple[str, ...]:
    """The distinct words, most common first (reversed for a foreign vocabulary)."""
    seen: dict[str, None] = {}
    for word in (*_WORDS.split(), *_CAPITALISED.split()):
        seen.setdefault(word, None)
    words = tuple(seen)
    return words[::-1] if foreign else words


@dataclass(frozen=True)
class Vocabulary:
    """Token texts, SPM scores and token types by id; ``words`` are the ids of whole-word tokens."""

    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    words: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, text: str) -> int:
        return self.tokens.index(text)


def build_vocabulary(foreign: bool = False, size: int | None = None) -> Vocabulary:
    """The vocabulary; ``size`` pads it with unused tokens (``<unused00042>``) up to that many ids."""
    tokens: list[str] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types: list[int] = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL]
    scores: list[float] = [0.0] * len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    scores += [0.0] * 256
    index: dict[str, int] = {}

    def add(text: str, score: float) -> int:
        if text not in index:
            index[text] = len(tokens)
            tokens.append(text)
            types.append(NORMAL)
            scores.append(score)
        return index[text]

    for code in range(0x21, 0x7F):
        add(chr(code), -1e6)
    add("\u2581", -1e6)
    words: list[int] = []
    rank = 0.0
    for word in word_list(foreign):
        piece = "\u2581" + word
        for end in range(2, len(piece)):
            rank += 1
            add(piece[:end], -rank)
        rank += 1
        words.append(add(piece, -rank))
    # llama.cpp puts a space in front of the text after a control token ("<|im_start|>user" gives "▁user"), and a
    # prompt's first word after a newline has none: both are pieces, never answers (not in ``words``)
    for piece in (*("\u2581" + role for role in _ROLES), *_ROLES, *_CAPITALISED.split()):
        for end in range(2, len(piece) + 1):
            add(piece[:end], -2e6 - end)
    if size is not None:
        if size < len(tokens):
            raise ValueError(f"a vocabulary of {size} tokens is smaller than the {len(tokens)} pieces it must hold")
        for i in range(len(tokens), size):
            tokens.append(f"<unused{i:05d}>")
            types.append(UNUSED)
            scores.append(-1e9)
    return Vocabulary(tokens=tuple(tokens), scores=tuple(scores), types=tuple(types), words=tuple(words))
