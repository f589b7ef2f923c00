"""Evaluation metrics, independent of any model: classification (accuracy, precision/recall/F1, the
confusion matrix), entity-level tagging scores equal to seqeval's, SQuAD v1.1 exact match / F1, and speech
recognition's word and character error rates (equal to jiwer's, summed as edit counts).
Only numpy and the standard library are imported (translation scores, in ``tformer.evaluation.translation``,
import sacrebleu when called)."""

from tformer.evaluation.classification import (
    ClassificationScores,
    accuracy,
    classification_scores,
    confusion_matrix,
)
from tformer.evaluation.entities import (
    EntityScores,
    TagError,
    entity_counts,
    entity_scores,
    entity_spans,
    scores_from_counts,
)
from tformer.evaluation.scores import Scores, precision_recall_f1
from tformer.evaluation.speech import (
    EditCounts,
    TranscriptionScores,
    character_error_rate,
    error_counts,
    normalise_transcript,
    transcription_scores,
    word_error_rate,
)
from tformer.evaluation.squad import SquadScores, exact_match, normalize_answer, squad_scores, token_f1

__all__ = ["ClassificationScores", "EditCounts", "EntityScores", "Scores", "SquadScores", "TagError",
           "TranscriptionScores", "accuracy", "character_error_rate", "classification_scores", "confusion_matrix",
           "entity_counts", "entity_scores", "entity_spans", "error_counts", "exact_match", "normalise_transcript",
           "normalize_answer", "precision_recall_f1", "scores_from_counts", "squad_scores", "token_f1",
           "transcription_scores", "word_error_rate"]
