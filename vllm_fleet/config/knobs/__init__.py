"""Every host knob, declared once, by the sections of group_data/all.py: one module per section, in
its order (config/settings.py joins them into Settings). Each knob is a knob() field
(config/schema.py): its type, default, one-line doc, the notes users read above it in
group_data/all.py, its bounds or kind of text, and the fix for a bad value. group_data/all.py,
docs/knobs.md and the README's excerpt are written from these declarations
(`python -m vllm_fleet.config.reference --write`)."""
