"""The datasets tformer's recipes (configs/*.toml) and benchmarks read, by name: each file's public source
URL(s), tried in order, and the SHA-256 that verifies it (``tformer data fetch NAME``, ``tformer.data.fetch``).

A dataset named NAME lives in ``ROOT/NAME/`` (``ROOT``: ``TFORMER_DATA``, a recipe's ``[data] root``, or the
cache), laid out as ``../shared/data`` beside the project is, so that folder serves as a root as it is.

One rule verifies every file: ``sha256`` is the SHA-256 of its content, and for a file whose name ends in
``.gz`` that is the content it decompresses to. So a gzip container made here from an upstream plain file
(``input.txt`` fetched, ``input.txt.gz`` stored), one kept byte for byte as published (Multi30k), and one
rebuilt around the same bytes (``../shared/data``'s MNIST training images) all verify alike. A source whose
URL ends in ``.gz`` is stored as served; a plain source under a ``.gz`` name is verified, then compressed
(gzip level 9, no timestamp). ``header``: the file as upstream publishes it with its first line replaced by
this one (GLUE's header on the phrase-level SST-2 training file); the hash is of the result.

Sources and commits are those of ``../shared/data/README.md``; every GitHub file was checked against the
shared copy by its git blob id at that commit. Hashes were computed from ``../shared/data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset: ``path`` inside the dataset's folder, ``urls`` to try in order, ``sha256`` of
    its content (decompressed for a ``.gz`` path), and ``header`` replacing upstream's first line."""

    path: str
    urls: tuple[str, ...]
    sha256: str
    header: str | None = None


@dataclass(frozen=True)
class Dataset:
    """A named dataset: its files, where they come from (one line) and their license."""

    name: str
    files: tuple[DataFile, ...]
    source: str
    license: str


def github(repo: str, commit: str, path: str) -> str:
    """The raw URL of ``path`` in the GitHub repository ``repo`` at ``commit``."""
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


CHAR_RNN = "karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"
PYTORCH_EXAMPLES = "pytorch/examples", "d5678bc8ac0cdd79dbd5e44d4130271018bcec4e"
MULTI30K = "multi30k/dataset", "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MNIST = "pmallari/MNIST", "cffbed29f2a5bd3b662ffe9cea7c07129fdad5d2"
MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/")
FASHION = "zalandoresearch/fashion-mnist", "658ec8c1128c1d31796c5260af8b78eca85d6f8b"
FASHION_MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
SST2_SENTENCES = "YJiangcm/SST-2-sentiment-analysis", "ca3869fa59a56d316e73b41074abcb0226886de8"
SST2_GLUE = "brunnurs/binary-classification-bert", "35e1628db50472679176dd31b992534a3866a86e"
SST2_PHRASES = "TaoCesc/binary_cls", "6a73b09b39af0efe049622662211f3657c75a15e"
WNUT17 = "leondz/emerging_entities_17", "e52a2d2a71ac1a051ca2d532eef28653c5c02603"
SQUAD = "rajpurkar/SQuAD-explorer", "240e165ab706d95bd4323653bb92421f446208cf"
TORCHTEXT = "pytorch/text", "a5e610638ea47b4412a29cdb708ac5f2fabb1286"
TORCHTEXT_ASSETS = "test/torchtext_unittest/asset/"
GSM8K = "openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c"
OPENAI_GPT2 = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"  # tiktoken's gpt2 files, same hashes
FSDD = "Jakobovski/free-spoken-digit-dataset", "26eb9aaf76e81b692f806f9140c2d2777410d7a1"
FSDD_HASHES = Path(__file__).with_name("fsdd_recordings.sha256")  # sha256sum lines: HASH  recordings/NAME.wav


def _wikitext2() -> tuple[DataFile, ...]:
    hashes = {
        "valid": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
        "test": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
    }
    folder = "word_language_model/data/wikitext-2/"
    return tuple(DataFile(f"{split}.txt.gz", (github(*PYTORCH_EXAMPLES, f"{folder}{split}.txt"),), digest)
                 for split, digest in hashes.items())


def _multi30k() -> tuple[DataFile, ...]:
    hashes = {
        "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
        "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
        "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
        "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
        "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
        "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
        "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
        "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
        "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    }
    return tuple(DataFile(f"{name}.gz", (github(*MULTI30K, f"data/task1/raw/{name}.gz"),), digest)
                 for name, digest in hashes.items())


def _mnist() -> tuple[DataFile, ...]:
    hashes = {  # train-images: no GitHub copy; ../shared/data's is rebuilt, its content equal to the original's
        "train-images-idx3-ubyte.gz": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte.gz": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    }
    return tuple(DataFile(name, ((github(*MNIST, name),) if not name.startswith("train-images") else ())
                          + tuple(mirror + name for mirror in MNIST_MIRRORS), digest)
                 for name, digest in hashes.items())


def _fashion_mnist() -> tuple[DataFile, ...]:
    hashes = {
        "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    }
    files = tuple(DataFile(name, (github(*FASHION, f"data/fashion/{name}"), FASHION_MIRROR + name), digest)
                  for name, digest in hashes.items())
    return files + (DataFile("LICENSE", (github(*FASHION, "LICENSE"),),
                             "13ef4788476d292858fa60eb9a5f74aeca5c65770bc885ccaa05823a17ef7be1"),)


def _sst2() -> tuple[DataFile, ...]:
    sentences = {
        "train": "5b56af66a194e685c0fbde5f58c4355ab00f5485a29bfcae1085b4b9f8b1a6c3",
        "dev": "c9ddb67ce3068540c5bb6562e1f34788302dd06d570e6ca0d5e61f7d5ef2bfad",
        "test": "5e133ae65857bb44629508a8924531a1e4dd2d64f2a831507803512b4bb49043",
    }
    return tuple(DataFile(f"sentence-level/{split}.tsv", (github(*SST2_SENTENCES, f"data/{split}.tsv"),), digest)
                 for split, digest in sentences.items()) + (
        DataFile("train.tsv.gz", (github(*SST2_PHRASES, "data/SST-2/train.tsv"),),
                 "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1", header="sentence\tlabel"),
        DataFile("dev.tsv", (github(*SST2_GLUE, "data/SST2/dev.tsv"),),
                 "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0"),
        DataFile("test.tsv", (github(*SST2_GLUE, "data/SST2/test.tsv"),),
                 "69a938605609b3e6663b4487918fe1565eb293734e6e520d0366d1d412fd2a13"),
    )


def _wnut17() -> tuple[DataFile, ...]:
    hashes = {
        "wnut17train.conll": "731820e13f71af324c6b55a1575ec2ce59fbaa2a0806f8f0400b98d56cd6a7a5",
        "emerging.dev.conll": "e053b752b8155113ca66e7db08af5f2f5f43ab993694e4774f1ec5bad42312d8",
        "emerging.test.annotated": "2aa79b764e56ec9264a1b30fdd9b70195bd00ff400b62edd8f399d5f13c178f0",
    }
    return tuple(DataFile(name, (github(*WNUT17, name),), digest) for name, digest in hashes.items())


def _fsdd() -> tuple[DataFile, ...]:
    """The 3,000 recordings (their hashes in a file beside this module: too many to list here)."""
    files = []
    for line in FSDD_HASHES.read_text(encoding="ascii").splitlines():
        digest, path = line.split(maxsplit=1)
        files.append(DataFile(path, (github(*FSDD, path),), digest))
    return tuple(files)


def _datasets() -> dict[str, Dataset]:
    datasets = [
        Dataset("tinyshakespeare", (DataFile("input.txt.gz", (github(*CHAR_RNN, "data/tinyshakespeare/input.txt"),),
                                             "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),),
                "github.com/karpathy/char-rnn data/tinyshakespeare/", "public domain text; repository MIT"),
        Dataset("wikitext-2", _wikitext2(),
                "github.com/pytorch/examples word_language_model/data/wikitext-2/ (valid, test)", "CC BY-SA 3.0"),
        Dataset("multi30k", _multi30k(), "github.com/multi30k/dataset data/task1/raw/ (test_2017/2018 held out)",
                "research and education use (Flickr30K terms)"),
        Dataset("mnist", _mnist(), "github.com/pmallari/MNIST; the training images from PyTorch's and Google's "
                "MNIST mirrors", "CC BY-SA 3.0 (Y. LeCun, C. Cortes)"),
        Dataset("fashion-mnist", _fashion_mnist(), "github.com/zalandoresearch/fashion-mnist data/fashion/",
                "MIT (Zalando SE)"),
        Dataset("sst2", _sst2(), "SST-2 sentences: github.com/YJiangcm/SST-2-sentiment-analysis; GLUE files: "
                "github.com/brunnurs/binary-classification-bert, github.com/TaoCesc/binary_cls",
                "no explicit license (SST, GLUE); research use"),
        Dataset("wnut17", _wnut17(), "github.com/leondz/emerging_entities_17", "CC BY 4.0"),
        Dataset("squad-v1.1", (DataFile("dev-v1.1.json.gz", (github(*SQUAD, "dataset/dev-v1.1.json"),),
                                        "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9"),),
                "github.com/rajpurkar/SQuAD-explorer dataset/dev-v1.1.json (dev only)", "CC BY-SA 4.0"),
        Dataset("tokenizers/gpt2", (
            DataFile("encoder.json", (OPENAI_GPT2 + "encoder.json",),  # torchtext's copy has an extra newline
                     "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
            DataFile("vocab.bpe", (github(*TORCHTEXT, TORCHTEXT_ASSETS + "gpt2_bpe_vocab.bpe"),
                                   OPENAI_GPT2 + "vocab.bpe"),
                     "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5")),
                "OpenAI's GPT-2 encoding files (tiktoken's gpt2); github.com/pytorch/text", "MIT (OpenAI GPT-2)"),
        Dataset("tokenizers/bert-base-uncased", (
            DataFile("vocab.txt", (github(*TORCHTEXT, TORCHTEXT_ASSETS + "bert_base_uncased_vocab.txt"),),
                     "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),),
                "github.com/pytorch/text (BERT's uncased WordPiece vocabulary)", "Apache-2.0 (Google BERT)"),
        Dataset("fsdd", _fsdd(), "github.com/Jakobovski/free-spoken-digit-dataset recordings/", "CC BY-SA 4.0"),
        Dataset("gsm8k", (
            DataFile("train.jsonl.gz", (github(*GSM8K, "grade_school_math/data/train.jsonl"),),
                     "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"),
            DataFile("test.jsonl", (github(*GSM8K, "grade_school_math/data/test.jsonl"),),
                     "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14")),
                "github.com/openai/grade-school-math grade_school_math/data/", "MIT (OpenAI)"),
    ]
    return {dataset.name: dataset for dataset in datasets}


DATASETS: dict[str, Dataset] = _datasets()
