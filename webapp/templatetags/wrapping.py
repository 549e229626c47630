"""Where a long name may wrap: words wrap only between words, and a snake_case name is words joined by "_"."""
from django import template
from django.utils.html import conditional_escape
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def word_breaks(text) -> str:
    """``text`` escaped, with a line-break opportunity (``<wbr>``) after each underscore, so that a field name such
    as activation_checkpointing wraps between its words, never inside one."""
    return mark_safe(conditional_escape(text).replace("_", "_<wbr>"))
