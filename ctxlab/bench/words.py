"""The words synthetic prompts are made of: 1,024 common words from the Shakespeare text that
ships with ctxlab, each one token (with its leading space) in SmolLM2's tokenizer, and so in
most BPE tokenizers of its kind. A prompt of N words is then N tokens on the default model
(and close to it elsewhere; the server's own `usage.prompt_tokens` is what results report),
and the load generator needs no tokenizer: it runs against any server without its model.

Words are joined as " w1 w2 ...": every word carries its leading space, so a block of words
tokenizes the same wherever it sits, and equal blocks are equal tokens to a prefix cache.
"""

from __future__ import annotations

WORDS: tuple[str, ...] = tuple(
    (
        "about above abroad absence account act action advise affairs affection after again "
        "against age aid air alive all almost alone along already always ancient and anger angry "
        "another answer any appear are arm arms army art aside ask asleep attend authority awake "
        "away back bad banished bark base battle bear bears beat beauty because become becomes "
        "bed been before beg begin begins behind behold being believe belly bend benefit best "
        "better between bid bids birth bite bitter black blame bless blessed blood bloody blow "
        "blows body bold bones book born borne both bound bow boy brain brave break breast "
        "breath breathe bride brief bright bring broke broken brother brothers brought brow "
        "brows buried burn business but buy call calls came can cannot care cares carry case "
        "cast castle cause certain chamber chance change changed charge charity cheek cheeks "
        "cheer child children choice choose church citizens city claim clock close clouds cold "
        "come comes comfort coming command common company condemn condition confess consent "
        "content corn could counsel country course court cousin coward crave creature cried "
        "cries cross crown cruel cry cure curse cut dance danger dangerous dare dark daughter "
        "day days dead deadly dear death deed deeds deep defend deliver demand deny depart "
        "deputy deserve deserved desire despair desperate despite devil devise did die died "
        "dinner dispatch divine does dog doing done doom door double doubt down draw drawn "
        "dreadful dream dreams drink drop drown drunk dry duke dull dust duty each ear early "
        "ears earth ease easy eat effect either else encounter end enemies enemy enjoy enough "
        "enter envy even ever every evil excuse execution eye eyes face faced faint fair faith "
        "fall false far farewell fast fatal father fault faults favour fear fearful feast feel "
        "fell fellow fellows fetch few field fiery fight fill find fine finger fire first fit "
        "five fled flesh flower flowers fly foe foes follow followers follows fond fool foolish "
        "foot for forbid force forget forgot form former forth fortune forward fought foul found "
        "four free fresh friend friends from full further fury gain garments gates gave general "
        "gentle gentleman gentlemen get girl give given gives glad glass glory god gods goes "
        "going gold golden gone good got grace gracious grant grave great greater green grief "
        "ground grow grown guard guess guilty had hair half hand hands hang hanging happy hard "
        "harm has hast hate hath have having head heads health hear heard hearing heart hearts "
        "heaven heavens heavy heir held hell help hence her here herself hide high him himself "
        "his hither hold holy home honest honesty honour honours hope horse hot hour hours house "
        "how humble humour hundred husband idle ignorant ill indeed into issue itself join joy "
        "judge judgment just justice keep kept kill kind kindness king kingdom kings kiss knee "
        "knees knew knock know knowledge known knows labour lack ladies lady laid lamb land "
        "lands last late laugh law lawful lay lead learn least leave leaves left leisure less "
        "lest let letter letters liberty lie lies life light like lips little live lived lives "
        "living long longer look looks lord lords lose loss lost love loved loves loving mad "
        "made maid majesty make makes man manner many march mark marriage married marry master "
        "masters match matter may mayor mean meaning means measure meat meet men mercy met might "
        "mighty mind mine mistress mock money moon more morning mortal most mother motion mouth "
        "move moved much murder music must myself name names nature near neck need needs neither "
        "never new news next night nine noble noise none nor nose not note nothing now nurse "
        "oath obey occasion off offence offer office officer oft often old once one ones only "
        "open oracle order other others our ours ourselves out over own pain pains pair pale "
        "pardon part party pass passing past patience patient pawn pay peace people perceive "
        "perform person piece pity place plague plain play please pleased pleasure point poison "
        "poor possess possible post power practise pray prayer prayers precious prepare prepared "
        "presence present presently pretty pride priest prince prison prisoner private proclaim "
        "promise promised proof proud prove purpose put quarrel queen question quick quickly "
        "quiet quite rage rather read ready reason reasons receive received red reign remain "
        "remedy remember repent report request respect rest return revenge rich rid right rise "
        "rotten rough royal run sacred sad safe safety said saint sake same satisfied save saw "
        "say says scarce scorn sea seal seat second secret see seek seem seems seen self senate "
        "send sense sent sentence servant serve service set seven shake shall shalt shame she "
        "shed sheep shepherd ship short should show shows sick side sigh sight silence silver "
        "simple sin since sing sir sister sit sits six slain slaughter slave sleep slew small "
        "smile soft soldier soldiers some something son sons soon sorrow sort soul souls sound "
        "sour sovereign speak speaks speech speed spent spirit spoke spoken sport spring stain "
        "stand stands stars state stay steal steel still stir stone stones stood stop straight "
        "strange strength strike strong struck subject subjects such sudden suffer suit summer "
        "sun sure swear sweet swift sword swords sworn take taken tale talk teach tear tears "
        "tell ten tender tent than thank thanks that the thee their them then thence there "
        "therefore therein thereof these they thing things think thinks this those thou though "
        "thought thoughts thousand three thrive throat throne through throw thunder thus thy "
        "till time times title together told tongue tongues too took touch toward towards town "
        "treason trial triumph trouble true truly trust truth try tune turn twenty twice two "
        "uncle under unto upon use used vain vantage vengeance very vice victory view villain "
        "virtue virtuous visit voice voices vow walk wall walls want war warm warrant wars was "
        "wash watch water way weak wear weary weeds weeping welcome well went were what when "
        "whence where wherein whether which while whilst white who whole whom whose why wicked "
        "widow wife wild will wilt win wind wings winter wisdom wise wish wit with within "
        "without witness wives woman womb women won wonder word words work world worse worship "
        "worst worth worthy would wounds writ wrong wrongs year years yet yield you young your "
        "yours yourself youth "
    ).split()
)


def text_of(indices: list[int] | tuple[int, ...]) -> str:
    """Words by index (modulo the list), each with its leading space."""
    n = len(WORDS)
    return "".join(" " + WORDS[i % n] for i in indices)
