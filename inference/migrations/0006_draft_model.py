# Speculative decoding by a draft model: the method, the draft model and its KV cache.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0005_source_catalogue'),
    ]

    operations = [
        migrations.AlterField(
            model_name='modelconfig',
            name='num_speculative_tokens',
            field=models.PositiveIntegerField(default=5, help_text='Draft tokens per step (0: off), guessed by the speculative method below and checked by the model; in float32 answers are unchanged.'),
        ),
        migrations.AddField(
            model_name='modelconfig',
            name='speculative_method',
            field=models.CharField(choices=[('ngram', 'n-gram prompt lookup (no second model)'), ('draft', 'draft model (the draft source below)')], default='ngram', help_text='n-gram lookup speeds up answers that quote the prompt or the documents; a draft model of the same family speeds up any answer (docs/benchmarks.md).', max_length=8),
        ),
        migrations.AddField(
            model_name='modelconfig',
            name='draft_source',
            field=models.CharField(blank=True, help_text='The draft model (speculative method \'draft\'): as the source above, and with the same tokenizer, e.g. qwen2.5-coder-0.5b-instruct for qwen2.5-coder-1.5b-instruct.', max_length=500),
        ),
        migrations.AddField(
            model_name='modelconfig',
            name='draft_kv_cache_mb',
            field=models.PositiveIntegerField(blank=True, default=None, help_text="The draft model's own KV cache. Empty: as many tokens as the model's.", null=True, verbose_name='draft KV cache MB'),
        ),
    ]
