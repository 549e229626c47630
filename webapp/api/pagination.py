from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination

from .parsers import MAX_INT


def _one_whole_number(given: list[str]) -> bool:
    return len(given) == 1 and given[0].isascii() and given[0].isdigit() and 1 <= int(given[0]) <= MAX_INT


class Pagination(PageNumberPagination):
    """Pages of 50 by default; ``page_size`` a 64-bit integer from 1 up, more than 1,000 reads as 1,000. A ``page``
    or ``page_size`` that is not one such integer is refused as the schema says, not silently replaced by a default
    (a page past the last is a 404)."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request):
        given = request.query_params.getlist(self.page_size_query_param)
        if not given:
            return self.page_size
        if not _one_whole_number(given):
            raise ValidationError({self.page_size_query_param: [
                f"{', '.join(map(repr, given))}: give one whole number of items per page, from 1 "
                f"(more than {self.max_page_size} reads as {self.max_page_size})"]})
        return min(int(given[0]), self.max_page_size)

    def get_page_number(self, request, paginator):
        given = request.query_params.getlist(self.page_query_param)
        if not given:
            return 1
        if not _one_whole_number(given):
            raise ValidationError({self.page_query_param: [
                f"{', '.join(map(repr, given))}: give one page number, from 1"]})
        return int(given[0])

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] in (self.page_size_query_param, self.page_query_param):
                parameter["schema"]["minimum"] = 1
        return parameters
