"""tests/python/llm_compressor_producer.py: FP8 checkpoints as llm-compressor writes them, for the
tests that read them (test_fp8_checkpoints.py, test_checkpoint_ecosystem.py): oneshot with a preset
scheme on a bf16 model saved at `base`, nothing downloaded. Not a test itself."""
import torch

# Kept in high precision, as llm-compressor's MoE examples keep them: the LM head and the routers.
IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]


# compressed-tensors' group strategy for FP8 weights (no preset names it): 1 x 128 weight groups,
# dynamic per-token activations, as a config group of llm-compressor's QuantizationModifier.
FP8_GROUP = {"group_0": {"targets": ["Linear"],
                         "weights": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128,
                                     "symmetric": True, "dynamic": False},
                         "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                               "dynamic": True}}}


def produce(base, out, scheme):
    """llm-compressor's oneshot with a preset scheme (FP8_DYNAMIC, FP8_BLOCK, FP8) or FP8_GROUP
    (above), saved compressed at `out`. FP8 (static activations) calibrates on 4 samples of 16
    random token ids through a word-level tokenizer built here (a processor is required with a
    dataset)."""
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    kwargs = {}
    if scheme == "FP8":
        from datasets import Dataset
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(WordLevel({f"t{i}": i for i in range(256)}, unk_token="t0")),
            unk_token="t0", pad_token="t0")
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, 256, (4, 16), generator=g).tolist()
        kwargs = dict(dataset=Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 16] * 4}), processor=tok,
                      num_calibration_samples=4, max_seq_length=16)
    modifier = QuantizationModifier(config_groups=FP8_GROUP, ignore=IGNORE) if scheme == "FP8_GROUP" else \
        QuantizationModifier(targets="Linear", scheme=scheme, ignore=IGNORE)
    oneshot(model=model, recipe=modifier, **kwargs)
    model.save_pretrained(out, save_compressed=True)
