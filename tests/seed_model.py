"""The seeds' own model, as the widely copied sentiment tutorial writes it:
a BertModel wrapped in the user's nn.Module, dropout and a Linear over the
pooled output, the loss computed outside it (issue 41). One source for the
tests and benches that plan it: SOURCE runs as a notebook cell where `nn`,
`BertModel` and `cfg` (a BertConfig) are defined, or through define()."""

SOURCE = '''
class SentimentClassifier(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.bert = BertModel(cfg)
        self.drop = nn.Dropout(p=0.3)
        self.out = nn.Linear(self.bert.config.hidden_size, n_classes)
    def forward(self, input_ids, attention_mask):
        pooled = self.bert(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        return self.out(self.drop(pooled))
'''


def define(nn, BertModel, cfg):
    """The class, its BertModel built from cfg."""
    ns = {"nn": nn, "BertModel": BertModel, "cfg": cfg}
    exec(compile(SOURCE, "<the seeds' SentimentClassifier>", "exec"), ns)
    return ns["SentimentClassifier"]
