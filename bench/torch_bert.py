"""The torch reference model the cpu benchmarks time against: a BERT
classifier (word/position/type embeddings, LayerNorm, post-LN encoder layers
with GELU, pooler tanh, 2-label head, dropout 0.1), written with torch.nn
because transformers is not installed here (nn.TransformerEncoderLayer
computes BERT's layer). Shared by bench/ops_cpu/step_torch.py and
bench/train_cpu/train_torch.py."""
import torch
import torch.nn as nn

# layers, hidden, heads, intermediate
DIMS = {"bert-tiny": (2, 128, 2, 512), "bert-mini": (4, 256, 4, 1024), "bert-small": (4, 512, 8, 2048),
        "bert-medium": (8, 512, 8, 2048), "bert-base-uncased": (12, 768, 12, 3072)}


class Bert(nn.Module):
    def __init__(self, model):
        super().__init__()
        L, H, NH, I = DIMS[model]
        self.word, self.pos, self.typ = nn.Embedding(30522, H), nn.Embedding(512, H), nn.Embedding(2, H)
        self.ln = nn.LayerNorm(H, eps=1e-12)
        self.drop = nn.Dropout(0.1)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(H, NH, I, 0.1, activation="gelu", batch_first=True,
                                                               layer_norm_eps=1e-12) for _ in range(L))
        self.pool, self.cls = nn.Linear(H, H), nn.Linear(H, 2)

    def forward(self, ids, pad):
        T = ids.shape[1]
        x = self.word(ids) + self.pos(torch.arange(T))[None] + self.typ(torch.zeros_like(ids))
        x = self.drop(self.ln(x))
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        return self.cls(self.drop(torch.tanh(self.pool(x[:, 0]))))


def batch(B, T):
    """The synthetic batch the C side uses too: ids, no padding, labels."""
    ids = (1000 + (torch.arange(B * T) * 7919) % 20000).reshape(B, T)
    return ids, torch.zeros(B, T, dtype=torch.bool), torch.arange(B) % 2
