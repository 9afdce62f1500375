"""Translation: a trained model (or an ensemble) turned into text, and the text scored.

:mod:`.translator` reads raw sentences, batches them and detokenizes the output; :mod:`.search` is greedy and
beam search over any :class:`.search.Decoder`; :mod:`.length_penalty` ranks finished hypotheses; :mod:`.ensemble`
decodes several models as one; :mod:`.scoring` is sacreBLEU and the paper's tokenized BLEU."""

from revnmt.translation.ensemble import Ensemble
from revnmt.translation.length_penalty import LENGTH_PENALTY_TYPES, LengthPenalty
from revnmt.translation.scoring import Evaluation, evaluate
from revnmt.translation.translator import Translation, Translator

__all__ = ["LENGTH_PENALTY_TYPES", "Ensemble", "Evaluation", "LengthPenalty", "Translation", "Translator", "evaluate"]
